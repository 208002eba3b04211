"""The app a service runs, as a new user writes it: ``llm_latency.instrument()`` at import, the
SDK set up by nobody (llm-latency then sets it up from ``OTEL_*``), and each request to the
service calls the LLM server at ``$UPSTREAM`` once.

    gunicorn tests.programs.served:wsgi          (sync, gthread)
    gunicorn -k uvicorn_worker.UvicornWorker tests.programs.served:asgi
    uvicorn --workers 2 tests.programs.served:asgi
    hypercorn tests.programs.served:asgi

``WARMUP=1``: one call at import too (in a pre-fork master, with ``--preload``), which the
master, and only the master, must export.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import httpx
import requests

import llm_latency

llm_latency.instrument()

UPSTREAM = os.environ["UPSTREAM"]

if os.environ.get("WARMUP") == "1":
    requests.get(UPSTREAM, timeout=10).raise_for_status()


def wsgi(environ: dict[str, Any], start_response: Callable[..., object]) -> Iterable[bytes]:
    """A WSGI app: one call with requests."""
    requests.get(UPSTREAM, timeout=10).raise_for_status()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]


Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def asgi(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """An ASGI app: one call with httpx, and the lifespan protocol."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    async with httpx.AsyncClient(timeout=10) as client:
        (await client.get(UPSTREAM)).raise_for_status()
    headers = [(b"content-type", b"text/plain"), (b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})
