"""The in-process metric contract (DESIGN.md, "Metrics"): ``llm_latency.phase.duration`` for
the phases whose presence is the news (queue when the attempt waited, dns, connect, proxy, tls), every
phase with ``phase_metrics="all"``; ``llm_latency.event_loop.lag`` for the attempts that lagged
by at least the monitor's threshold. The spans keep every phase either way."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
import pytest
import requests
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import INVALID_SPAN, Span, set_span_in_context

import llm_latency
from llm_latency.attempt_record import AttemptRecord
from llm_latency.facts import AttemptFacts, LoopLag, read_facts
from llm_latency.instrumentor import LLMLatencyInstrumentor
from llm_latency.metrics import LAG_RECORDED_FROM, SETUP_PHASES, AttemptMetrics
from llm_latency.testing import LocalDNS
from llm_latency.timeline import PHASE_NAMES, Timeline
from tests.attributes import float_attr
from tests.conftest import Telemetry, metric_points
from tests.servers import LLMServer

HOST = "llm.test"  # resolved by the test's DNS server (tests.servers.slow_dns)


async def _round(server: LLMServer, dns: LocalDNS, client_ssl: ssl.SSLContext) -> None:
    """A new TLS connection to a name the test's DNS resolves (dns, connect, tls, send, wait,
    receive), then two requests at once through that pool of one (one of them waits: queue)."""
    resolver = aiohttp.AsyncResolver(nameservers=[dns.nameserver])
    try:
        connector = aiohttp.TCPConnector(limit=1, resolver=resolver, ssl=client_ssl)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def post() -> None:
                async with session.post(server.url(host=HOST, wait=0.05), json={}) as response:
                    await response.read()

            await post()
            await asyncio.gather(post(), post())
    finally:
        await resolver.close()


def phase_counts(telemetry: Telemetry) -> dict[str, int]:
    return {
        point.attributes["llm_latency.phase"]: point.count
        for point in telemetry.metric_points("llm_latency.phase.duration")
    }


def span_phases(telemetry: Telemetry) -> Counter[str]:
    return Counter(span.name for span in telemetry.spans() if span.name.startswith("http."))


@pytest.fixture
async def setup_telemetry() -> AsyncIterator[Telemetry]:
    telemetry = Telemetry()
    telemetry.instrument()
    try:
        yield telemetry
    finally:
        llm_latency.uninstrument()


async def test_by_default_only_the_set_up_phases_are_recorded(
    setup_telemetry: Telemetry, tls_server: LLMServer, dns: LocalDNS, client_ssl: ssl.SSLContext
) -> None:
    await _round(tls_server, dns, client_ssl)
    assert phase_counts(setup_telemetry) == {"dns": 1, "connect": 1, "tls": 1, "queue": 1}
    # (and proxy, for an attempt through a proxy's tunnel: tests/test_proxies.py)
    assert {PHASE_NAMES[phase] for phase in SETUP_PHASES} == {
        "queue", "dns", "connect", "proxy", "tls",
    }  # fmt: skip
    # Send, wait and receive stay on the spans (the Collector's span metrics count them).
    spans = span_phases(setup_telemetry)
    assert spans["http.send"] == spans["http.wait"] == spans["http.receive"] == 3
    assert spans["http.queue"] == 1
    (duration,) = setup_telemetry.metric_points("http.client.request.duration")
    assert duration.count == 3


async def test_phase_metrics_all_records_every_phase(
    tls_server: LLMServer, dns: LocalDNS, client_ssl: ssl.SSLContext
) -> None:
    telemetry = Telemetry()
    telemetry.instrument(phase_metrics="all")
    try:
        await _round(tls_server, dns, client_ssl)
    finally:
        llm_latency.uninstrument()
    assert phase_counts(telemetry) == {
        "dns": 1, "connect": 1, "tls": 1, "queue": 1, "send": 3, "wait": 3, "receive": 3,
    }  # fmt: skip


async def test_a_sync_client_records_its_set_up_phases(server: LLMServer) -> None:
    telemetry = Telemetry()
    telemetry.instrument(phase_spans=False)
    try:
        with requests.Session() as session:
            for _ in range(2):
                await asyncio.to_thread(session.post, server.url(), json={})
    finally:
        llm_latency.uninstrument()
    assert phase_counts(telemetry) == {"connect": 1}


def test_an_unknown_choice_is_refused() -> None:
    with pytest.raises(ValueError, match="phase_metrics='some'"):
        llm_latency.instrument(phase_metrics="some", configure=False)  # type: ignore[arg-type]
    assert not LLMLatencyInstrumentor().is_instrumented_by_opentelemetry


def lagged(phase: str, lag: float) -> list[float]:
    """Per phase, as ``LoopLag.phases``: ``lag`` (s) in ``phase``, none in the others."""
    lags = [0.0] * len(PHASE_NAMES)
    lags[PHASE_NAMES.index(phase)] = lag
    return lags


def record_lag(metrics: AttemptMetrics, span: Span, context: Context, lag: LoopLag) -> AttemptFacts:
    """Record a finished attempt whose loop lagged ``lag``, under ``span`` in ``context``;
    returns its facts."""
    timeline = Timeline("POST", "http://llm.test/v1/chat/completions")
    timeline.close()
    record = AttemptRecord(timeline, span, context, "POST", "llm.test", 443, 0, None)
    facts = read_facts(timeline, lag, frozenset())
    metrics.record(record, facts, context)
    return facts


@pytest.mark.parametrize(
    ("lags", "recorded"),
    [((0.0, 0.0, 0.0005, LAG_RECORDED_FROM, 0.05), (LAG_RECORDED_FROM, 0.05)), ((0.0,), ())],
)
def test_the_lag_histogram_counts_the_attempts_that_lagged(
    lags: tuple[float, ...], recorded: tuple[float, ...]
) -> None:
    """Attempts whose loop lagged less than the monitor's threshold are not recorded: the
    histogram's count is the attempts that lagged (their lag attribute is on the span either
    way)."""
    reader = InMemoryMetricReader()
    metrics = AttemptMetrics(MeterProvider(metric_readers=[reader]).get_meter("test"), "setup")
    for lag in lags:
        facts = record_lag(metrics, INVALID_SPAN, Context(), LoopLag(lagged("receive", lag)))
        assert facts.event_loop_lag == lag
    points = metric_points(reader, "llm_latency.event_loop.lag")
    if not recorded:
        assert points == []
        return
    (point,) = points
    assert isinstance(point, HistogramDataPoint)
    assert point.count == len(recorded)
    assert point.sum == pytest.approx(sum(recorded))


def test_the_lag_record_carries_the_exemplar_the_monitor_chose() -> None:
    """Each attempt's lag is recorded in its trace's context; the exemplar is offered only for
    the attempt the monitor marks (the first it charged in a late stretch): the others, in
    buckets of their own here, keep none."""
    reader = InMemoryMetricReader()
    metrics = AttemptMetrics(MeterProvider(metric_readers=[reader]).get_meter("test"), "setup")
    tracer = TracerProvider().get_tracer("program")
    marked = None
    for lag, exemplar in ((0.004, False), (0.04, True), (0.4, False)):
        span = tracer.start_span("attempt")
        lag_of = LoopLag(lagged("wait", lag), exemplar=exemplar)
        facts = record_lag(metrics, span, set_span_in_context(span), lag_of)
        assert facts.event_loop_lag_exemplar is exemplar
        if exemplar:
            marked = span.get_span_context()
        span.end()
    (point,) = metric_points(reader, "llm_latency.event_loop.lag")
    assert isinstance(point, HistogramDataPoint)
    assert point.count == 3
    assert marked is not None
    assert [(e.trace_id, e.span_id, e.value) for e in point.exemplars] == [
        (marked.trace_id, marked.span_id, 0.04)
    ]


async def test_a_stalled_loop_is_in_the_lag_histogram(
    setup_telemetry: Telemetry, server: LLMServer
) -> None:
    """An attempt whose loop is stalled while its answer waits lagged: it is counted, with the
    lag its span carries; so is every other attempt that reached the threshold. The stall
    starts as the server (on the same loop) has read the request, whose answer, written in the
    same turn of the loop, then waits in the socket through the stall: a stall started on a
    timer could, on a loaded machine, come before the request was sent, and the answer, written
    after it, more than ``SETTLE_NS`` after it (no lag, rightly)."""
    headers, arrived = server.arrival()
    async with aiohttp.ClientSession() as session:

        async def stall() -> None:
            await arrived.wait()
            time.sleep(0.2)  # noqa: ASYNC251 - the stall under test

        async def stalled() -> None:
            async with session.get(server.url(), headers=headers) as response:
                await response.read()

        await asyncio.gather(stalled(), stall())
    (lag,) = [float_attr(span, "llm_latency.event_loop.lag") for span in setup_telemetry.attempts()]
    assert lag >= 0.1
    (point,) = setup_telemetry.metric_points("llm_latency.event_loop.lag")
    assert point.count == 1
    assert point.sum == pytest.approx(lag)
