"""Load and memory: many concurrent streams, and a long run of sequential requests, leave no
span, Timeline or callback behind, keep memory flat, and drop nothing that should be exported.
(Throughput with the plugin against without is a benchmark: bench/throughput.py.)"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Sequence

import aiohttp
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import llm_latency
from llm_latency.adapters import aiohttp as aiohttp_adapter
from llm_latency.instrumentor import LLMLatencyInstrumentor
from llm_latency.timeline import Timeline
from tests.conftest import Telemetry
from tests.servers import LLMServer


class CountingExporter(SpanExporter):
    """Counts what the SDK's BatchSpanProcessor hands over (the spans that were exported)."""

    def __init__(self) -> None:
        self.count = 0
        self.names: dict[str, int] = {}

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.count += len(spans)
        for span in spans:
            self.names[span.name] = self.names.get(span.name, 0) + 1
        return SpanExportResult.SUCCESS


def live_timelines() -> int:
    gc.collect()
    return sum(1 for obj in gc.get_objects() if isinstance(obj, Timeline))


async def test_a_thousand_concurrent_streams(telemetry: Telemetry, server: LLMServer) -> None:
    url = server.url(chunks=5, gap=0.01, sse=1)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> int:
            async with session.get(url) as response:
                return len([line async for line in response.content])

        counts = await asyncio.gather(*(one() for _ in range(1000)))
    assert counts == [12] * 1000  # five events and [DONE], each a data line and a blank line
    requests = telemetry.requests()
    assert len(requests) == 1000
    assert {r.attributes["llm_latency.stream.events"] for r in requests} == {6}  # type: ignore[index]
    telemetry.assert_all_ended_once()
    assert aiohttp_adapter._streams == {}
    emitter = LLMLatencyInstrumentor().emitter
    assert emitter is not None
    assert emitter._open == set()
    (duration,) = telemetry.metric_points("http.client.request.duration")
    assert duration.count == 1000


async def test_long_run_memory_is_flat_and_nothing_is_dropped(server: LLMServer) -> None:
    total, warmup, checkpoint = 50_000, 2_000, 10_000
    exporter = CountingExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    llm_latency.instrument(
        tracer_provider=provider, meter_provider=MeterProvider(metric_readers=[reader]),
        configure=False,
    )  # fmt: skip
    url = server.url()
    traced: dict[int, int] = {}
    try:
        async with aiohttp.ClientSession() as session:
            for number in range(1, total + 1):
                async with session.get(url) as response:
                    await response.read()
                if number == warmup:
                    gc.collect()
                    tracemalloc.start()
                elif number in (checkpoint, total):
                    provider.force_flush()  # the export queue's fill level is not a leak
                    gc.collect()
                    traced[number] = tracemalloc.get_traced_memory()[0]
            del response  # the last response (and the Timeline it carries) is the test's own
    finally:
        tracemalloc.stop()
        llm_latency.uninstrument()
    provider.force_flush()
    # Flat after warm-up: 40,000 more requests grow traced memory by less than 50 bytes each
    # (a request left behind holds several kilobytes: a Timeline, its spans, its response).
    # What remains is noise of the process (here between 5 kB and 400 kB from run to run).
    growth = traced[total] - traced[checkpoint]
    assert growth < 2_000_000, growth
    assert live_timelines() == 0
    # Every request span and its three phase spans (pooled: send, wait, receive) exported.
    assert exporter.names["GET /v1/chat/completions"] == total
    assert exporter.names["http.wait"] == total
    assert exporter.count == total * 4 + 1  # the first request also connected: + http.connect
    data = reader.get_metrics_data()
    assert data is not None
    points = [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
              if m.name == "http.client.request.duration" for p in m.data.data_points]  # fmt: skip
    assert sum(p.count for p in points) == total
