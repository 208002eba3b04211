"""Real peers on loopback for the tests: an LLM-like HTTP(S) server and a slow DNS server
(the product's own). Delays are injected, so tests can check phases. The TCP front that holds
the TLS ClientHello is the mock server's ``HandshakeDelay``; peers that misbehave are in
``tests/bad_servers.py``."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from llm_latency.testing import LocalDNS

SECRET_RESPONSE_BODY = "response-body-secret-7f3a"


# -- the LLM-like server --------------------------------------------------------------------


def _number(request: web.Request, name: str, default: float = 0.0) -> float:
    return float(request.query.get(name, default))


async def _chat(request: web.Request) -> web.StreamResponse:
    """OpenAI-style chat completions, shaped by query parameters.

    wait: seconds before the headers; status: response status; chunks and gap: a streamed
    body of ``chunks`` parts ``gap`` seconds apart (SSE when ``sse=1``); reset: abort the
    connection after that many chunks; header_NAME: extra response headers.
    """
    await request.read()
    # fail=N&scenario=KEY: the first N attempts of that scenario fail, as fail_with says:
    # a status code (429 carries retry-after-ms=retry_ms), or "reset" (the connection is cut).
    if (scenario := request.query.get("scenario")) is not None:
        attempts = request.app[ATTEMPTS]
        attempts[scenario] = attempts.get(scenario, 0) + 1
        if attempts[scenario] <= int(request.query.get("fail", 0)):
            failure = request.query.get("fail_with", "429")
            if failure == "reset":
                assert request.transport is not None
                request.transport.abort()
                return web.Response()
            retry_headers = {"retry-after-ms": request.query.get("retry_ms", "150")}
            return web.Response(status=int(failure), text="failed",
                                headers=retry_headers if failure == "429" else {})  # fmt: skip
    wait = _number(request, "wait")
    if wait:
        await asyncio.sleep(wait)
    status = int(request.query.get("status", 200))
    headers = {
        "x-request-id": "req_test_123",
        "openai-processing-ms": str(int(wait * 1000)),
        "x-ratelimit-remaining-requests": "42",
        "x-ratelimit-remaining-tokens": "9000",
        "set-cookie": "session=cookie-secret-9c1d",
    }
    for name, value in request.query.items():
        if name.startswith("header_"):
            headers[name[len("header_") :]] = value
    chunks = int(request.query.get("chunks", 0))
    if not chunks:
        body = json.dumps({"choices": [{"message": {"content": SECRET_RESPONSE_BODY}}]})
        return web.Response(status=status, text=body, headers=headers,
                            content_type="application/json")  # fmt: skip
    sse = request.query.get("sse") == "1"
    gap = _number(request, "gap")
    reset = int(request.query.get("reset", -1))
    response = web.StreamResponse(status=status, headers=headers)
    response.content_type = "text/event-stream" if sse else "application/octet-stream"
    await response.prepare(request)
    if sse:
        parts = [
            f"data: {json.dumps({'choices': [{'delta': {'content': f'tok{i}'}}]})}\n\n"
            for i in range(chunks)
        ]
    elif request.query.get("fmt") == "json":
        text = json.dumps({"parts": [f"part{i}" for i in range(chunks)]})
        size = -(-len(text) // chunks)
        parts = [text[i : i + size] for i in range(0, len(text), size)]
    else:
        parts = [f"chunk{i}\n" for i in range(chunks)]
    for i, part in enumerate(parts):
        if i == reset:
            assert request.transport is not None
            request.transport.abort()
            return response
        if i and gap:
            await asyncio.sleep(gap)
        await response.write(part.encode())
    if sse:
        await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def _redirect(request: web.Request) -> web.Response:
    raise web.HTTPFound("/v1/chat/completions")


@dataclass
class LLMServer:
    """A running aiohttp.web server; ``url(path, **query)`` builds request URLs."""

    host: str
    port: int
    scheme: str
    runner: web.AppRunner
    requests: collections.deque[dict[str, Any]] = field(default_factory=collections.deque)
    #: Set when a request carrying ``x-test-marker: <key>`` reaches the handler.
    arrivals: dict[str, asyncio.Event] = field(default_factory=dict)
    #: The server answers a request carrying ``x-test-marker: <key>`` once this is set.
    releases: dict[str, asyncio.Event] = field(default_factory=dict)

    def arrival(self) -> tuple[dict[str, str], asyncio.Event]:
        """Headers to send, and the event set when the server has read that request."""
        marker = uuid.uuid4().hex
        event = self.arrivals[marker] = asyncio.Event()
        return {"x-test-marker": marker}, event

    def holding(self) -> tuple[dict[str, str], asyncio.Event, asyncio.Event]:
        """Headers to send, the event set when the server has read that request, and the event
        that lets the server answer it: until it is set, the request holds its connection,
        however long the machine takes to run what the test does meanwhile."""
        headers, arrived = self.arrival()
        release = self.releases[headers["x-test-marker"]] = asyncio.Event()
        return headers, arrived, release

    def url(self, path: str = "/v1/chat/completions", host: str | None = None, **query: Any) -> str:
        qs = "&".join(f"{k}={v}" for k, v in query.items())
        return f"{self.scheme}://{host or self.host}:{self.port}{path}" + (f"?{qs}" if qs else "")


ATTEMPTS = web.AppKey("attempts", dict)


@contextlib.asynccontextmanager
async def llm_server(ssl_context: Any = None, host: str = "127.0.0.1") -> AsyncIterator[LLMServer]:
    app = web.Application()
    app[ATTEMPTS] = {}
    seen: collections.deque[dict[str, Any]] = collections.deque(maxlen=1000)  # the latest
    arrivals: dict[str, asyncio.Event] = {}
    releases: dict[str, asyncio.Event] = {}

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        seen.append({"path": request.path, "headers": dict(request.headers)})
        marker = request.headers.get("x-test-marker", "")
        arrived = arrivals.get(marker)
        if arrived is not None:
            arrived.set()
        release = releases.get(marker)
        if release is not None:  # a guard against a hang, not a bound
            await asyncio.wait_for(release.wait(), 30)
        return await handler(request)

    app.middlewares.append(record)
    app.router.add_route("*", "/v1/chat/completions", _chat)
    app.router.add_route("*", "/redirect", _redirect)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, 0, ssl_context=ssl_context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield LLMServer(
            host, port, "https" if ssl_context else "http", runner, seen, arrivals, releases
        )
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[int]:
    """``app`` on a free loopback port for the length of the block: its port."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


# -- a DNS server that answers after a delay --------------------------------------------------


def slow_dns() -> LocalDNS:
    """A real UDP DNS server on loopback (dnslib): A 127.0.0.1 for names under ``.test``,
    NXDOMAIN for anything else; ``.resolver.delay`` sets how long it takes to answer."""
    return LocalDNS({"*.test": "127.0.0.1"})


def unused_port() -> int:
    """A loopback port with nothing listening on it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
