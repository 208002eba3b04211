"""A program instrumented with llm-latency, exporting spans and metrics (batch, 100 ms) to a
collector that hangs: it times N requests per client before and after ``instrument()``, then
times the providers' shutdown, and prints what it measured as one JSON line.

    python tests/programs/hanging_collector.py COLLECTOR_PORT N
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import aiohttp
import httpx
import httpx2
import requests
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import llm_latency


class Handler(BaseHTTPRequestHandler):
    """A small JSON answer to every GET, on a keep-alive connection."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes

    def do_GET(self) -> None:
        body = b'{"choices": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def timed(get: Callable[[], object], n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        get()
        times.append(time.perf_counter() - start)
    return times


async def aiohttp_times(url: str, n: int) -> list[float]:
    times = []
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            start = time.perf_counter()
            async with session.get(url) as response:
                await response.read()
            times.append(time.perf_counter() - start)
    return times


def run_all(url: str, n: int) -> dict[str, list[float]]:
    """``n`` timed requests with each client."""
    out = {}
    with requests.Session() as session:
        out["requests"] = timed(lambda: session.get(url, timeout=5).content, n)
    with httpx.Client(timeout=5) as client:
        out["httpx"] = timed(lambda: client.get(url).content, n)
    with httpx2.Client(timeout=5) as client2:
        out["httpx2"] = timed(lambda: client2.get(url).content, n)
    out["aiohttp"] = asyncio.run(aiohttp_times(url, n))
    return out


class Ends(SpanProcessor):
    """Records each span's start and end, and the server port of each that ends."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.ended: list[int] = []
        self.ports: list[object] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.started.append(span.get_span_context().span_id)

    def on_end(self, span: ReadableSpan) -> None:
        context = span.get_span_context()
        assert context is not None  # an SDK span always has one
        self.ended.append(context.span_id)
        self.ports.append((span.attributes or {}).get("server.port"))


def main(collector: int, n: int) -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1/chat/completions"

    run_all(url, n)  # warm up: imports, first connections
    bare = run_all(url, n)

    endpoint = f"http://127.0.0.1:{collector}"
    tracer_provider = TracerProvider()
    ends = Ends()
    tracer_provider.add_span_processor(ends)
    tracer_provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces", timeout=1),
            schedule_delay_millis=100,
        )
    )
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=f"{endpoint}/v1/metrics", timeout=1),
        export_interval_millis=200,
        export_timeout_millis=1000,
    )
    meter_provider = MeterProvider(metric_readers=[reader])
    llm_latency.instrument(
        tracer_provider=tracer_provider, meter_provider=meter_provider, configure=False
    )
    traced = run_all(url, n)
    time.sleep(0.5)  # let the exporters reach the collector and hang there
    start = time.perf_counter()
    tracer_provider.shutdown()
    meter_provider.shutdown()
    shutdown = time.perf_counter() - start
    llm_latency.uninstrument()
    print(
        json.dumps(
            {
                "bare": bare,
                "traced": traced,
                "shutdown": shutdown,
                "started": ends.started,
                "ended": ends.ended,
                "ports": ends.ports,
            }
        )
    )


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
