"""``llm-latency advise``, the findings service: real programs' spans reach it over OTLP/HTTP from
the OpenTelemetry SDK's own exporter (protobuf, gzip or not) or as OTLP JSON, on loopback; it
reads them into calls, diagnoses each (service, host) window as ``diagnose()`` does the
program's own spans, and serves the findings as Prometheus metrics, a page and JSON."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

import llm_latency
from llm_latency.advise import AdviseServer, Advisor, Settings
from llm_latency.diagnosis import diagnose
from tests.servers import LLMServer

SERVICE = "advise-test"
#: The seed's burst: 30 requests at once through a pool of 5 per host, to a slow server.
BURST, POOL, SERVER_WAIT = 30, 5, 0.2


@dataclass
class Program:
    """An instrumented program whose spans go to the findings service over OTLP/HTTP, and to
    memory (what ``diagnose()`` reads of it)."""

    provider: TracerProvider
    memory: InMemorySpanExporter

    def spans(self) -> list[ReadableSpan]:
        self.provider.force_flush()
        return list(self.memory.get_finished_spans())


@pytest.fixture
def advise() -> Iterator[AdviseServer]:
    # settle 0 and no interval of its own: the test runs each diagnosis when its spans are in.
    server = AdviseServer(("127.0.0.1", 0), Advisor(Settings(settle=0.0, interval=3600)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def program(advise: AdviseServer, **exporter: Any) -> Iterator[Program]:
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    otlp = OTLPSpanExporter(endpoint=f"{advise.url}/v1/traces", **exporter)
    provider.add_span_processor(BatchSpanProcessor(otlp, schedule_delay_millis=100))
    llm_latency.instrument(
        tracer_provider=provider, meter_provider=MeterProvider(), configure=False
    )
    try:
        yield Program(provider, memory)
    finally:
        llm_latency.uninstrument()
        provider.shutdown()


@pytest.fixture
def instrumented(advise: AdviseServer) -> Iterator[Program]:
    yield from program(advise)


@pytest.fixture
def gzipped(advise: AdviseServer) -> Iterator[Program]:
    yield from program(advise, compression=Compression.Gzip)


async def burst(server: LLMServer, limit_per_host: int = POOL) -> None:
    """The seed's program: BURST requests at once through one session's pool."""
    connector = aiohttp.TCPConnector(limit_per_host=limit_per_host)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            async with session.post(server.url(wait=SERVER_WAIT), json={}) as response:
                await response.read()

        await asyncio.gather(*(one() for _ in range(BURST)))


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read()


def post(url: str, body: bytes, content_type: str) -> int:
    request = urllib.request.Request(url, body, {"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The samples of a Prometheus text exposition, read by prometheus_client's parser."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_pool_burst_found_as_diagnose_finds_it(
    advise: AdviseServer, instrumented: Program, server: LLMServer
) -> None:
    """The seed's pool-limited burst, sent by the SDK's OTLP/HTTP exporter (protobuf): the
    service's first finding for the program's host is pool-queue, with the fix and the saving
    that ``diagnose()`` gives on the program's own spans."""
    await burst(server)
    own = diagnose(instrumented.spans())
    snapshot = advise.advisor.run_diagnosis(everything=True)
    assert own[0].rule == "pool-queue"
    found = [a for a in snapshot.advice if (a.service, a.host) == (SERVICE, "127.0.0.1")]
    assert [a.finding for a in found] == own
    pool = found[0]
    assert pool.finding.saving is not None and pool.saved == pytest.approx(
        pool.finding.saving.total
    )
    calls = snapshot.windows[0].calls
    assert calls == BURST
    assert 0 < pool.share < 1
    assert pool.finding.evidence.count >= BURST - POOL - 1  # every request past the pool waited


async def test_metrics_page_and_json(
    advise: AdviseServer, instrumented: Program, server: LLMServer
) -> None:
    """/metrics carries the saving per service, host and rule (share and per minute), the
    evidence's count and the fix; the page and the JSON list the finding with its fix."""
    await burst(server)
    instrumented.spans()
    snapshot = advise.advisor.run_diagnosis(everything=True)
    pool = next(a for a in snapshot.advice if a.rule == "pool-queue")
    status, content_type, body = get(f"{advise.url}/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    seen = samples(body.decode())
    key = frozenset({"service": SERVICE, "host": "127.0.0.1", "rule": "pool-queue"}.items())
    assert seen["llm_latency_advice_saving_ratio", key] == pytest.approx(pool.share)
    per_minute = seen["llm_latency_advice_saving_seconds_per_minute", key]
    assert per_minute == pytest.approx(pool.saved / pool.covered * 60)
    assert seen["llm_latency_advice_evidence", key] == pool.finding.evidence.count
    page = f"{advise.url}/?service={SERVICE}&host=127.0.0.1"
    info = key | {("fix", pool.finding.fix), ("page", page)}
    assert seen["llm_latency_advice_finding_info", info] == 1
    window = frozenset({"service": SERVICE, "host": "127.0.0.1"}.items())
    assert seen["llm_latency_advice_window_calls", window] == BURST
    assert seen["llm_latency_advice_spans_received_total", frozenset()] == len(instrumented.spans())

    status, content_type, body = get(f"{advise.url}/findings.json?service={SERVICE}")
    assert status == 200 and content_type == "application/json"
    listed = json.loads(body)["findings"][0]
    assert (listed["rule"], listed["host"]) == ("pool-queue", "127.0.0.1")
    assert listed["finding"]["fix"] == pool.finding.fix
    assert listed["saving_ratio"] == pytest.approx(pool.share)

    status, content_type, body = get(f"{advise.url}/?service={SERVICE}")
    assert status == 200 and content_type.startswith("text/html")
    assert "aiohttp.TCPConnector(" in body.decode() and "pool-queue" in body.decode()
    assert b"pool-queue" not in get(f"{advise.url}/?service=another")[2]


async def test_gzip_and_json_bodies(
    advise: AdviseServer, gzipped: Program, server: LLMServer
) -> None:
    """The same spans gzipped by the SDK's exporter, and as OTLP JSON (the encoding the
    Collector's otlp_http exporter sends with ``encoding: json``), give the same finding."""
    await burst(server)
    spans = gzipped.spans()
    first = advise.advisor.run_diagnosis(everything=True).advice
    assert first and first[0].rule == "pool-queue"
    json_body = json.dumps(MessageToDict(encode_spans(spans))).encode()
    other = AdviseServer(("127.0.0.1", 0), Advisor(Settings(settle=0.0, interval=3600)))
    thread = threading.Thread(target=other.serve_forever, daemon=True)
    thread.start()
    try:
        assert post(f"{other.url}/v1/traces", json_body, "application/json") == 200
        again = other.advisor.run_diagnosis(everything=True).advice
    finally:
        other.shutdown()
        other.server_close()
    assert [a.finding for a in again] == [a.finding for a in first]


async def test_healthy_burst_raises_nothing(
    advise: AdviseServer, instrumented: Program, server: LLMServer
) -> None:
    """The same burst through a pool as large as the burst: no pool finding, no saving."""
    await burst(server, limit_per_host=BURST)
    instrumented.spans()
    snapshot = advise.advisor.run_diagnosis(everything=True)
    assert snapshot.windows[0].calls == BURST
    assert [a.rule for a in snapshot.advice if a.rule == "pool-queue"] == []
    assert "llm_latency_advice_saving_ratio{" not in get(f"{advise.url}/metrics")[2].decode()


async def test_otlp_grpc_as_the_collector_sends_it(server: LLMServer) -> None:
    """The SDK's OTLP/gRPC exporter, as the Collector's otlp_grpc and loadbalancing exporters
    call TraceService/Export: the same pool finding as diagnose() on the program's spans."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GRPCSpanExporter,
    )

    from llm_latency.advise.grpc_input import grpc_server
    from tests.servers import unused_port

    advisor = Advisor(Settings(settle=0.0, interval=3600))
    port = unused_port()
    receiver = grpc_server(advisor, f"127.0.0.1:{port}")
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    exporter = GRPCSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=100))
    llm_latency.instrument(
        tracer_provider=provider, meter_provider=MeterProvider(), configure=False
    )
    try:
        await burst(server)
        provider.force_flush()
    finally:
        llm_latency.uninstrument()
        provider.shutdown()
        receiver.stop(1).wait()
    own = diagnose(list(memory.get_finished_spans()))
    found = advisor.run_diagnosis(everything=True).advice
    assert own[0].rule == "pool-queue"
    assert [a.finding for a in found] == own


def test_bad_requests_are_refused(advise: AdviseServer) -> None:
    """A body that is not OTLP is a 400 (the sender does not retry it); other paths 404."""
    assert (
        post(f"{advise.url}/v1/traces", b"\xff\x00 not protobuf", "application/x-protobuf") == 400
    )
    assert post(f"{advise.url}/v1/traces", b"[1, 2]", "application/json") == 400
    assert post(f"{advise.url}/v1/traces", b"{}", "text/csv") == 400
    assert post(f"{advise.url}/v1/metrics", b"", "application/x-protobuf") == 404
    assert get(f"{advise.url}/nothing")[0] == 404
    assert get(f"{advise.url}/healthz")[0] == 200
