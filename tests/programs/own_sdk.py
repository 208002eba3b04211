"""The app of a program that sets the OpenTelemetry SDK up itself (OTLP to
``$OTEL_EXPORTER_OTLP_ENDPOINT``), then calls ``llm_latency.instrument()``, with the recipes of
docs/stopping.md that flush its providers when it is stopped:

- ASGI (uvicorn, gunicorn's uvicorn worker): flush in the lifespan's shutdown;
- WSGI under gunicorn: ``tests/programs/gunicorn_flush.py``'s ``worker_exit``;
- ``python tests/programs/own_sdk.py URL N``: N calls, READY, then it waits for SIGTERM, which
  the recipe turns into a normal exit (``sys.exit(143)``), so that the SDK's atexit runs.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import httpx
import requests
from opentelemetry import metrics, trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import llm_latency

tracer_provider = TracerProvider()
tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
meter_provider = MeterProvider([PeriodicExportingMetricReader(OTLPMetricExporter())])
trace.set_tracer_provider(tracer_provider)
metrics.set_meter_provider(meter_provider)
llm_latency.instrument()

UPSTREAM = os.environ.get("UPSTREAM", "")


def wsgi(environ: dict[str, Any], start_response: Callable[..., object]) -> Iterable[bytes]:
    """A WSGI app: one call with requests."""
    requests.get(UPSTREAM, timeout=10).raise_for_status()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]


Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def asgi(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """An ASGI app: one call with httpx; its lifespan's shutdown flushes (the recipe)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                tracer_provider.force_flush()  # the recipe
                meter_provider.force_flush()
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    async with httpx.AsyncClient(timeout=10) as client:
        (await client.get(UPSTREAM)).raise_for_status()
    headers = [(b"content-type", b"text/plain"), (b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # the recipe
    for _ in range(int(sys.argv[2])):
        requests.get(sys.argv[1], timeout=10).raise_for_status()
    print("READY", flush=True)
    while True:
        time.sleep(1)
