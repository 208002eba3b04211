"""Shared fixtures: in-memory telemetry around an instrumented process, and loopback peers."""

from __future__ import annotations

import gc
import ssl
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import trustme
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import llm_latency
from llm_latency import emitter
from llm_latency.testing import LocalDNS
from tests.attributes import str_attr
from tests.servers import LLMServer, llm_server, slow_dns


class OpenSpans(SpanProcessor):
    """Counts the spans that ended, to prove none ended twice. It does nothing in ``on_start``:
    a processor that does makes llm-latency start its request spans live (``late_spans``), and
    the suite runs the path a program with the SDK's own processors takes. An attempt left open
    is what the emitter still has in flight (``assert_all_ended_once``)."""

    def __init__(self) -> None:
        self.ended: list[int] = []

    def on_end(self, span: ReadableSpan) -> None:
        assert span.context is not None
        self.ended.append(span.context.span_id)


#: Every Telemetry of the running test, checked at its end by ``_every_attempt_tiles``.
_CREATED: list[Telemetry] = []


class Telemetry:
    """What the instrumented code exported, with helpers to find request and phase spans."""

    def __init__(self) -> None:
        _CREATED.append(self)
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.open_spans = OpenSpans()
        self.tracer_provider.add_span_processor(self.open_spans)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def instrument(self, **kwargs: Any) -> None:
        llm_latency.instrument(
            tracer_provider=self.tracer_provider,
            meter_provider=self.meter_provider,
            configure=False,
            **kwargs,
        )

    def assert_all_ended_once(self) -> None:
        # Request spans and successful phase spans are handed over finished (on_end only): no
        # attempt is still in flight, and nothing ends twice.
        active = emitter.active
        assert active is None or not active.in_flight(), active and active.in_flight()
        assert len(set(self.open_spans.ended)) == len(self.open_spans.ended)
        assert len(self.open_spans.ended) == len(self.spans())

    def attempts(self) -> list[ReadableSpan]:
        """Attempt spans (CLIENT, or INTERNAL under another instrumentation's CLIENT span)."""
        return [
            s for s in self.spans()
            if s.attributes is not None and "url.full" in s.attributes
            and s.instrumentation_scope is not None
            and s.instrumentation_scope.name == "llm_latency"
        ]  # fmt: skip

    def assert_tiles(self) -> None:
        """No phase that did not happen: each attempt's phases are in order, never overlap,
        and lie inside the attempt's span; each carries the attempt's ``server.address``."""
        for attempt in self.attempts():
            phases = sorted(self.phases(attempt).values(), key=lambda s: s.start_time or 0)
            assert attempt.start_time is not None and attempt.end_time is not None
            host = str_attr(attempt, "server.address")
            previous_end, previous = attempt.start_time, "the attempt's start"
            for phase in phases:
                assert str_attr(phase, "server.address") == host, phase.name
                assert phase.start_time is not None and phase.end_time is not None
                assert phase.start_time >= previous_end, f"{phase.name} overlaps {previous}"
                assert phase.end_time >= phase.start_time, phase.name
                previous_end, previous = phase.end_time, phase.name
            assert previous_end <= attempt.end_time, f"{previous} outlasts {attempt.name}"

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def requests(self) -> list[ReadableSpan]:
        """Request spans (kind CLIENT), in the order they ended."""
        return [s for s in self.spans() if s.kind is SpanKind.CLIENT]

    def request(self) -> ReadableSpan:
        (only,) = self.requests()
        return only

    def phases(self, request: ReadableSpan) -> dict[str, ReadableSpan]:
        """The phase spans under ``request``, by phase name."""
        assert request.context is not None
        children = [
            s for s in self.spans()
            if s.parent is not None and s.parent.span_id == request.context.span_id
        ]  # fmt: skip
        by_phase = {str_attr(s, "llm_latency.phase"): s for s in children}
        assert len(by_phase) == len(children), "a phase was emitted twice"
        return by_phase

    def metric_points(self, name: str) -> list[Any]:
        return metric_points(self.reader, name)


def metric_points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    """The points of the metric ``name`` in one collection of ``reader``."""
    data = reader.get_metrics_data()
    points: list[Any] = []
    if data is None:
        return points
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    points.extend(metric.data.data_points)
    return points


def seconds(span: ReadableSpan) -> float:
    assert span.start_time is not None and span.end_time is not None
    return (span.end_time - span.start_time) / 1e9


@pytest.fixture(autouse=True)
def _every_attempt_tiles() -> Iterator[None]:
    """The one shared check, after every test that exported spans: see assert_tiles."""
    _CREATED.clear()
    yield
    for telemetry in _CREATED:
        telemetry.assert_tiles()
    _CREATED.clear()


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    t = Telemetry()
    t.instrument()
    try:
        yield t
    finally:
        llm_latency.uninstrument()


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="session")
def server_ssl(ca: trustme.CA) -> ssl.SSLContext:
    cert = ca.issue_cert("localhost", "llm.test", "127.0.0.1")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    return context


@pytest.fixture(scope="session")
def client_ssl(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


@pytest.fixture(scope="session")
def dns_server() -> Iterator[LocalDNS]:
    server = slow_dns()
    yield server
    server.stop()


@pytest.fixture
def dns(dns_server: LocalDNS) -> Iterator[LocalDNS]:
    dns_server.resolver.delay = 0.0
    dns_server.resolver.queries.clear()
    yield dns_server
    dns_server.resolver.delay = 0.0


@pytest.fixture
async def server() -> AsyncIterator[LLMServer]:
    async with llm_server() as s:
        yield s


@pytest.fixture
async def tls_server(server_ssl: ssl.SSLContext) -> AsyncIterator[LLMServer]:
    async with llm_server(ssl_context=server_ssl) as s:
        yield s


#: Set on a test marked ``xdist_group`` that pytest-xdist did not group (see below).
_UNGROUPED = pytest.StashKey[bool]()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` (``make test``), a test marked ``xdist_group`` must carry its
    group in its node id, where pytest-xdist reads it (after xdist's own hook, in each worker):
    otherwise the group's tests run at once on several workers, silently (pytest-xdist#1386,
    with pytest 9.2's structured node ids). Such a test fails, saying so."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid:
            item.stash[_UNGROUPED] = True


@pytest.fixture(autouse=True)
def _grouped_as_marked(request: pytest.FixtureRequest) -> None:
    if request.node.stash.get(_UNGROUPED, False):
        pytest.fail(
            "pytest-xdist did not group this test (--dist loadgroup): the tests marked "
            "xdist_group would run at once on several workers; see pyproject.toml's pytest range"
        )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before each test, outside anything it times, the heap so far (the imported SDKs and the
    test modules, 550k to 750k objects after collection; what the earlier tests imported and
    cached) is collected once and moved out of the cyclic collector's sight (``gc.freeze``).
    Unfrozen, a full collection walked all of it: 0.4 s on an idle 2-core machine, 2.1 s
    beside two CPU burners, holding the GIL in whichever thread it started, inside any timed
    request of any test. Now a collection walks what the running test made: its own garbage
    is collected as before (tests/test_failed_request_memory.py reads the cycles it makes).
    The first test pays the whole heap's collection, the others what the test before left."""
    gc.collect()
    gc.freeze()
