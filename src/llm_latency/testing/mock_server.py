"""An OpenAI-compatible mock server with a realistic latency profile, for the demo, for load
tests and for rehearsing alerts.

``POST /v1/chat/completions`` (streamed with ``"stream": true``, or not) and ``GET /v1/models``.
Every response carries ``x-request-id``, ``openai-processing-ms`` (the time the server really
spent from the request's arrival to its response headers, measured, as a real provider's is) and
``x-ratelimit-*`` headers. Every ``rate_limit_every``-th request gets a 429 with
``retry-after-ms``; a share ``error_rate`` of requests gets a 500. Over TLS, a throwaway
certificate authority (``trustme``) signs the server's certificate, and a front that holds each
ClientHello for ``tls_delay`` seconds makes the handshake as slow as a far server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import random
import ssl
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web


@dataclass
class Profile:
    """How the mock server behaves."""

    ttfb: float = 0.3
    tokens_per_second: float = 50.0
    tokens: int = 20
    rate_limit_every: int = 0
    retry_after_ms: int = 250
    error_rate: float = 0.0
    tls_delay: float = 0.0
    seed: int | None = None
    rate_limit_requests: int = 500


@dataclass
class ServerState:
    """The mock server's running state; ``rate_limit_next`` makes the next N requests 429."""

    profile: Profile
    counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    rng: random.Random = field(default_factory=random.Random)
    rate_limit_next: int = 0


STATE = web.AppKey("state", ServerState)
_log = logging.getLogger(__name__)


def log_to_stderr() -> None:
    """Show the server's log lines (one line per event, e.g. a client that hung up
    mid-response) on stderr: what ``llm-latency mock-server`` does."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("llm-latency mock-server: %(message)s"))
    _log.addHandler(handler)
    _log.setLevel(logging.INFO)
    _log.propagate = False


def _headers(state: ServerState, number: int, processing: float) -> dict[str, str]:
    limit = state.profile.rate_limit_requests
    return {
        "x-request-id": f"req_{uuid.uuid4().hex[:24]}",
        "openai-processing-ms": str(int(processing * 1000)),  # whole ms, never more than spent
        "openai-model": "mock-gpt",
        "x-ratelimit-limit-requests": str(limit),
        "x-ratelimit-remaining-requests": str(max(limit - number % limit, 0)),
        "x-ratelimit-limit-tokens": "200000",
        "x-ratelimit-remaining-tokens": str(200000 - (number * 100) % 200000),
        "x-ratelimit-reset-requests": "1s",
    }


async def _chat(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    profile = state.profile
    number = next(state.counter)
    loop = asyncio.get_running_loop()
    arrived = loop.time()
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    limited = state.rate_limit_next > 0
    if limited:
        state.rate_limit_next -= 1
    if limited or (profile.rate_limit_every and number % profile.rate_limit_every == 0):
        return web.json_response(
            {"error": {"message": "Rate limit reached (mock)", "type": "rate_limit_error"}},
            status=429,
            headers={
                **_headers(state, number, loop.time() - arrived),
                "retry-after-ms": str(profile.retry_after_ms),
                "retry-after": str(max(1, round(profile.retry_after_ms / 1000))),
            },
        )
    if profile.error_rate and state.rng.random() < profile.error_rate:
        return web.json_response(
            {"error": {"message": "Internal error (mock)", "type": "server_error"}}, status=500
        )
    await asyncio.sleep(profile.ttfb)
    model = str(body.get("model", "mock-gpt"))
    words = [f"token{i} " for i in range(profile.tokens)]
    base = {"id": f"chatcmpl-{number}", "created": 0, "model": model}
    if not body.get("stream"):
        # The whole answer is generated before the headers: that is the processing time.
        generation = profile.tokens / max(profile.tokens_per_second, 1e-3)
        await asyncio.sleep(generation)
        headers = _headers(state, number, loop.time() - arrived)
        return web.json_response(
            {
                **base,
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "".join(words)},
                    }
                ],
                "usage": {
                    "prompt_tokens": 8,
                    "completion_tokens": profile.tokens,
                    "total_tokens": 8 + profile.tokens,
                },
            },
            headers=headers,
        )
    response = web.StreamResponse(headers=_headers(state, number, loop.time() - arrived))
    response.content_type = "text/event-stream"
    gap = 1.0 / max(profile.tokens_per_second, 1e-3)
    sent = 0
    try:
        await response.prepare(request)
        for i, word in enumerate(words):
            if i:
                await asyncio.sleep(gap)
            chunk = {
                **base,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}],
            }
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            sent += 1
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except ConnectionResetError:  # aiohttp's ClientConnectionResetError too
        peer = request.remote or "the client"
        _log.info(
            "%s hung up mid-stream: request %d got %d of %d chunks", peer, number, sent, len(words)
        )
    return response


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "mock-gpt", "object": "model"}]})


def make_app(profile: Profile) -> web.Application:
    """The aiohttp application of the mock server."""
    app = web.Application()
    state = ServerState(profile)
    if profile.seed is not None:
        state.rng.seed(profile.seed)
    app[STATE] = state
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    return app


@dataclass
class Certificates:
    """A throwaway CA and a server certificate for the given names."""

    server_context: ssl.SSLContext
    ca_file: Path


def make_certificates(*names: str, directory: Path | None = None) -> Certificates:
    """Issue a certificate for ``names`` from a new CA; the CA is written to a PEM file."""
    import trustme

    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*names).configure_cert(server_context)
    folder = directory or Path(tempfile.mkdtemp(prefix="llm-latency-"))
    ca_file = folder / "mock-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return Certificates(server_context, ca_file)


class HandshakeDelay:
    """A TCP front that holds each connection's first bytes (the TLS ClientHello) for
    ``delay`` seconds before relaying everything to ``127.0.0.1:target_port``: the TCP connect
    is quick, the TLS handshake takes ``delay`` longer."""

    def __init__(self, target_port: int, delay: float) -> None:
        self._target_port = target_port
        self._delay = delay
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen; return the port."""
        self._server = await asyncio.start_server(self._relay, host, port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def __aenter__(self) -> HandshakeDelay:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Stop listening and cut the relays."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            first = await reader.read(65536)
            await asyncio.sleep(self._delay)
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target_port)
            up_writer.write(first)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


@dataclass
class RunningServer:
    """Where a started mock server listens."""

    host: str
    port: int
    scheme: str
    ca_file: Path | None
    state: ServerState

    def url(self, path: str = "/v1/chat/completions", host: str | None = None) -> str:
        """A URL of this server (``host`` replaces the listening address, e.g. a DNS name)."""
        shown = host or self.host
        if ":" in shown:
            shown = f"[{shown}]"
        return f"{self.scheme}://{shown}:{self.port}{path}"


@contextlib.asynccontextmanager
async def running(
    profile: Profile,
    host: str = "127.0.0.1",
    port: int = 0,
    tls: bool = False,
    names: tuple[str, ...] = ("localhost", "127.0.0.1"),
) -> AsyncIterator[RunningServer]:
    """Run the mock server until the context exits."""
    app = make_app(profile)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    certificates = make_certificates(*names) if tls else None
    front: HandshakeDelay | None = None
    try:
        if certificates is not None and profile.tls_delay > 0:
            inner = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=certificates.server_context)
            await inner.start()
            front = HandshakeDelay(_bound_port(inner), profile.tls_delay)
            bound = await front.start(host, port)
        else:
            site = web.TCPSite(
                runner,
                host,
                port,
                ssl_context=certificates.server_context if certificates else None,
            )
            await site.start()
            bound = _bound_port(site)
        yield RunningServer(
            host,
            bound,
            "https" if tls else "http",
            certificates.ca_file if certificates else None,
            app[STATE],
        )
    finally:
        if front is not None:
            await front.stop()
        await runner.cleanup()


def _bound_port(site: Any) -> int:
    server = site._server
    return int(server.sockets[0].getsockname()[1])
