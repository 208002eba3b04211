"""A long run of sequential aiohttp requests with llm-latency on, against the loopback LLM server:
what it measures (traced memory, live Timelines, exported spans and metric points) and what
must hold. ``tests/test_load.py`` runs a short one; ``bench/soak.py`` the full-size one."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import llm_latency
from llm_latency.timeline import Timeline
from tests.checks import histogram
from tests.servers import llm_server


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


def live_timelines() -> list[Timeline]:
    gc.collect()
    return [obj for obj in gc.get_objects() if isinstance(obj, Timeline)]


@dataclass
class LongRun:
    """What a run of ``total`` requests measured. Traced memory (tracemalloc, started after
    ``warmup`` requests) is read at ``checkpoint`` and at the end; its growth between them is
    what ``total - checkpoint`` more requests left behind."""

    total: int
    warmup: int
    checkpoint: int
    traced: dict[int, int] = field(default_factory=dict)
    timelines_left: int = -1
    exported: dict[str, int] = field(default_factory=dict)
    exported_count: int = 0
    duration_points: int = 0

    @property
    def growth(self) -> int:
        """Bytes of traced memory the requests after the checkpoint left behind."""
        return self.traced[self.total] - self.traced[self.checkpoint]

    def problems(self, bytes_per_request: float) -> list[str]:
        """What does not hold: memory flat (growth under ``bytes_per_request`` per request after
        the checkpoint), no Timeline left, every span and every duration point exported."""
        measured = self.total - self.checkpoint
        found = []
        if self.growth >= bytes_per_request * measured:
            found.append(
                f"traced memory grew {self.growth} B over {measured} requests "
                f"({self.growth / measured:.1f} B each, bound {bytes_per_request:g})"
            )
        if self.timelines_left != 0:
            found.append(f"{self.timelines_left} Timeline objects left alive")
        for name in ("GET /v1/chat/completions", "http.wait"):
            if self.exported.get(name, 0) != self.total:
                found.append(
                    f"{self.exported.get(name, 0)} {name!r} spans exported, not {self.total}"
                )
        # Pooled requests have three phase spans (send, wait, receive); the first also connected.
        if self.exported_count != self.total * 4 + 1:
            found.append(f"{self.exported_count} spans exported, not {self.total * 4 + 1}")
        if self.duration_points != self.total:
            found.append(f"{self.duration_points} request durations recorded, not {self.total}")
        return found


async def long_run(total: int, warmup: int, checkpoint: int) -> LongRun:
    """``total`` sequential GETs on one pooled aiohttp session, llm-latency exporting through the
    SDK's BatchSpanProcessor; returns the measurements."""
    assert 0 < warmup < checkpoint < total
    run = LongRun(total, warmup, checkpoint)
    # In a test worker, an earlier test may have left Timelines of its own (a request it
    # abandoned in a thread still running): only those this run made count.
    earlier = live_timelines()  # held, so that their ids stay theirs
    exporter = CountingExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    llm_latency.instrument(
        tracer_provider=provider, meter_provider=MeterProvider(metric_readers=[reader]),
        configure=False,
    )  # fmt: skip
    try:
        async with llm_server() as server, aiohttp.ClientSession() as session:
            url = server.url()
            for number in range(1, total + 1):
                async with session.get(url) as response:
                    await response.read()
                if number == warmup:
                    gc.collect()
                    tracemalloc.start()
                elif number in (checkpoint, total):
                    provider.force_flush()  # the export queue's fill level is not a leak
                    gc.collect()
                    run.traced[number] = tracemalloc.get_traced_memory()[0]
            del response  # the last response (and the Timeline it carries) is the run's own
    finally:
        tracemalloc.stop()
        llm_latency.uninstrument()
    provider.force_flush()
    run.timelines_left = sum(1 for left in live_timelines() if all(left is not e for e in earlier))
    run.exported = exporter.names
    run.exported_count = exporter.count
    data = reader.get_metrics_data()
    assert data is not None
    run.duration_points = sum(
        histogram(point).count
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == "http.client.request.duration"
        for point in metric.data.data_points
    )
    provider.shutdown()
    return run
