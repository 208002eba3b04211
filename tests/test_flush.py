"""``llm_latency.flush(timeout=...)``: what is buffered goes now, for jobs and serverless
handlers that freeze between invocations; bounded by its timeout when the collector is down."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import requests
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import llm_latency
from tests.otlp_receiver import OTLPReceiver
from tests.servers import LLMServer, unused_port
from tests.test_stopping import POOL_JOB, ROOT, WARNING, environment

N = 5


class Hanging(SpanExporter):
    """An exporter whose exports hang until released: a collector that does not answer."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(30)
        return SpanExportResult.SUCCESS


def batching(exporter: SpanExporter) -> TracerProvider:
    """The program's own provider, batching for a minute: nothing goes before a flush."""
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000))
    return provider


async def test_flush_sends_what_the_programs_own_providers_hold(server: LLMServer) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = batching(exporter)
    llm_latency.instrument(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(), configure=False
    )
    try:
        for _ in range(N):
            await asyncio.to_thread(requests.get, server.url(), timeout=10)
        assert exporter.get_finished_spans() == ()  # still in the batch
        assert await asyncio.to_thread(llm_latency.flush) is True
        attempts = [s for s in exporter.get_finished_spans() if "url.full" in (s.attributes or {})]
        assert len(attempts) == N
    finally:
        llm_latency.uninstrument()
        tracer_provider.shutdown()


async def test_flush_is_bounded_by_its_timeout(server: LLMServer) -> None:
    hanging = Hanging()
    tracer_provider = batching(hanging)
    reader = InMemoryMetricReader()
    llm_latency.instrument(
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(metric_readers=[reader]),
        configure=False,
    )
    try:
        await asyncio.to_thread(requests.get, server.url(), timeout=10)
        start = time.monotonic()
        flushed = await asyncio.to_thread(llm_latency.flush, timeout=0.3)
        took = time.monotonic() - start
        assert flushed is False
        assert took < 0.3 + 1.0, took  # the export hangs for 30 s
    finally:
        hanging.release.set()
        llm_latency.uninstrument()
        tracer_provider.shutdown()


def frozen_job(endpoint: str, url: str) -> str:
    """A job whose SDK llm-latency set up: its calls, flush(), then it is frozen (killed)."""
    process = subprocess.Popen(
        [sys.executable, str(POOL_JOB), "flush", url, str(N)],
        cwd=ROOT, env=environment(endpoint, url), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
    finally:
        process.send_signal(signal.SIGKILL)  # nothing runs at a kill: what went, went at flush
        _, stderr = process.communicate(timeout=30)
    return line + stderr


async def test_a_frozen_job_has_exported_everything_at_flush(server: LLMServer) -> None:
    receiver = OTLPReceiver()
    try:
        output = await asyncio.to_thread(frozen_job, receiver.endpoint, server.url())
    finally:
        receiver.stop()
    assert output.startswith("FLUSHED True "), output
    assert len(receiver.request_spans) == N
    assert receiver.duration_count == N

    down = f"http://127.0.0.1:{unused_port()}"
    output = await asyncio.to_thread(frozen_job, down, server.url())
    first, *rest = output.splitlines()
    assert first.startswith("FLUSHED False "), output
    assert float(first.split()[2]) < 1.0 + 1.0  # flush(timeout=1.0)
    assert sum(WARNING in line for line in rest) == 1, output
