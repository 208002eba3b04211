"""Instrument and uninstrument 20 times with the same providers, in a fresh process where no
library llm-latency hooks has been imported yet (each instrumentation waits for their import),
then print one JSON line: the ``Emitter`` objects alive after a full collection, the import
hooks in wrapt's process-wide registry per module, and ``live_state()``.

Then ``instrument()`` once more, import aiohttp, send one request to a loopback server and print
a second JSON line: the request spans exported (1 when the import installed the live
instrumentation's adapter).

    python tests/programs/instrument_cycles.py
"""

from __future__ import annotations

import asyncio
import gc
import http.server
import json
import threading

import wrapt.importer  # type: ignore[import-untyped]
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import llm_latency
from llm_latency.emitter import Emitter

CYCLES = 20


class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


async def one_request(url: str) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(url) as response:
        await response.read()


def main() -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    for _ in range(CYCLES):
        llm_latency.instrument(
            tracer_provider=tracer_provider, meter_provider=meter_provider, configure=False
        )
        llm_latency.uninstrument()
    gc.collect()
    emitters = sum(1 for found in gc.get_objects() if type(found) is Emitter)
    hooks = {name: len(found) for name, found in wrapt.importer._post_import_hooks.items()}
    print(json.dumps({"emitters": emitters, "hooks": hooks, "live": llm_latency.live_state()}))

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    llm_latency.instrument(
        tracer_provider=tracer_provider, meter_provider=meter_provider, configure=False
    )
    try:
        asyncio.run(one_request(f"http://127.0.0.1:{server.server_address[1]}/"))
    finally:
        llm_latency.uninstrument()
        server.shutdown()
    spans = [span for span in exporter.get_finished_spans() if span.kind is SpanKind.CLIENT]
    print(json.dumps({"request_spans": len(spans)}))


if __name__ == "__main__":
    main()
