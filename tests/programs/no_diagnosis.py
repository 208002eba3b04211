"""The instrumented path imports no diagnosis: ``import llm_latency``, ``instrument()`` and one
request through each client (aiohttp, httpx, httpx2, requests) to a loopback server, then a
JSON line: the ``llm_latency.diagnosis`` modules imported by then, the request spans made, and
whether ``llm_latency.diagnose`` still works when asked for.

    python tests/programs/no_diagnosis.py default|providers

``default``: the quick start's set-up (the SDK set up at the first request, from ``OTEL_*``);
``providers``: the program's own, with an in-memory exporter counting the request spans.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import llm_latency

BODY = b'{"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}'


class Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, format: str, *args: object) -> None:
        pass


async def aiohttp_get(url: str) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(url) as response:
        await response.read()


def main(mode: str) -> None:
    exporter = None
    if mode == "providers":
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        llm_latency.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider())
    else:
        llm_latency.instrument()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"

    import httpx
    import httpx2
    import requests

    asyncio.run(aiohttp_get(url))
    with httpx.Client(trust_env=False) as client:
        client.get(url).read()
    with httpx2.Client(trust_env=False) as client2:
        client2.get(url).read()
    with requests.Session() as session:
        session.trust_env = False
        session.get(url).content  # noqa: B018
    llm_latency.flush()
    imported = sorted(name for name in sys.modules if name.startswith("llm_latency.diagnosis"))
    from opentelemetry import trace

    spans = None
    if exporter is not None:
        spans = sum(1 for s in exporter.get_finished_spans() if s.kind.name == "CLIENT")
    print(
        json.dumps(
            {
                "diagnosis": imported,
                "spans": spans,
                "provider": type(trace.get_tracer_provider()).__module__,
                "findings": llm_latency.diagnose([]),
                "finding": llm_latency.Finding.__module__,
            }
        )
    )
    server.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
