"""A short look at llm-latency: requests to a built-in loopback LLM server, each printed as a
waterfall of its phases. No API key, no network beyond loopback, no collector needed.

    make demo        (or: python examples/demo.py)
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import llm_latency

SERVER_DELAY = 0.25  # "model" time before the first byte
TOKENS, TOKEN_GAP = 8, 0.04
WIDTH = 48


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    await asyncio.sleep(SERVER_DELAY)
    headers = {"x-request-id": f"req_demo_{id(request) % 10000:04d}",
               "openai-processing-ms": str(int(SERVER_DELAY * 1000))}  # fmt: skip
    if not body.get("stream"):
        return web.json_response({"choices": [{"message": {"content": "hi"}}]}, headers=headers)
    response = web.StreamResponse(headers=headers)
    response.content_type = "text/event-stream"
    await response.prepare(request)
    for i in range(TOKENS):
        await response.write(f"data: {json.dumps({'delta': f'tok{i}'})}\n\n".encode())
        await asyncio.sleep(TOKEN_GAP)
    await response.write(b"data: [DONE]\n\n")
    return response


def waterfall(exporter: InMemorySpanExporter, title: str) -> None:
    spans = exporter.get_finished_spans()
    exporter.clear()
    requests = [s for s in spans if s.kind is SpanKind.CLIENT]
    print(f"\n== {title}")
    origin = min(s.start_time or 0 for s in requests)
    end = max(s.end_time or 0 for s in requests)
    scale = WIDTH / max(end - origin, 1)
    for request in sorted(requests, key=lambda s: s.start_time or 0):
        attrs = request.attributes or {}
        total = ((request.end_time or 0) - (request.start_time or 0)) / 1e6
        reused = "pooled" if attrs.get("llm_latency.connection.reused") else "new connection"
        print(f"  {request.name}  {total:7.1f} ms  {reused}  "
              f"{(attrs.get('http.response.header.x-request-id') or ['-'])[0]}")  # fmt: skip
        assert request.context is not None
        phases: list[ReadableSpan] = sorted(
            (s for s in spans if s.parent and s.parent.span_id == request.context.span_id),
            key=lambda s: s.start_time or 0,
        )
        for phase in phases:
            start = int(((phase.start_time or 0) - origin) * scale)
            length = max(1, int(((phase.end_time or 0) - (phase.start_time or 0)) * scale))
            ms = ((phase.end_time or 0) - (phase.start_time or 0)) / 1e6
            print(f"    {phase.name:<13}{' ' * start}{'█' * length}"
                  f"{' ' * max(0, WIDTH - start - length)} {ms:7.1f} ms")  # fmt: skip
        if "gen_ai.response.time_to_first_chunk" in attrs:
            first = float(attrs["gen_ai.response.time_to_first_chunk"])  # type: ignore[arg-type]
            gap = float(attrs["llm_latency.stream.max_gap"])  # type: ignore[arg-type]
            print(f"    first chunk after {first * 1000:.1f} ms, "
                  f"{attrs['llm_latency.stream.events']} SSE events, "
                  f"longest gap {gap * 1000:.1f} ms")  # fmt: skip


async def main() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    llm_latency.instrument(tracer_provider=provider, configure=False)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://localhost:{port}/v1/chat/completions"

    async with aiohttp.ClientSession() as session:
        for _ in range(2):
            async with session.post(url, json={"model": "demo"}) as response:
                await response.json()
        waterfall(exporter, "two requests on one session: the second reuses the connection")

        async with session.post(url, json={"model": "demo", "stream": True}) as response:
            async for _ in response.content:
                pass
        waterfall(
            exporter, "a streamed completion: the request span lasts to the end of the stream"
        )

    connector = aiohttp.TCPConnector(limit_per_host=1)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            async with session.post(url, json={"model": "demo"}) as response:
                await response.json()

        await asyncio.gather(one(), one(), one())
        waterfall(exporter, "three at once with limit_per_host=1: http.queue shows the pool wait")
    await runner.cleanup()
    print("\nEach request is one CLIENT span; its children are the phases. "
          "Point OTEL_EXPORTER_OTLP_ENDPOINT at a collector to see them in Jaeger.")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
