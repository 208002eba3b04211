"""A mock LLM server with a realistic latency profile, for the demo, for load tests, for
rehearsing alerts and for a program's own tests. It speaks three APIs, each as its real SDK
reads it:

- OpenAI (:mod:`~llm_latency.testing.mock_openai`): ``POST /v1/chat/completions``, JSON or
  Server-Sent Events ending with a ``finish_reason: "stop"`` chunk, a usage chunk when
  ``stream_options.include_usage`` asks for it, and ``data: [DONE]``; ``GET /v1/models``.
  Headers ``x-request-id``, ``openai-processing-ms`` (the time the server really spent from
  the request's arrival to its response headers, measured, as a real provider's is) and
  ``x-ratelimit-*``.
- Anthropic (:mod:`~llm_latency.testing.mock_anthropic`): ``POST /v1/messages``, JSON or
  Anthropic's events (``message_start`` ... ``message_delta`` with ``stop_reason`` and usage,
  ``message_stop``); headers ``request-id`` and ``anthropic-ratelimit-*``. ``GET /v1/models``
  answers in Anthropic's shape to a request with an ``anthropic-version`` header.
- Ollama (:mod:`~llm_latency.testing.mock_ollama`): ``POST /api/chat`` and
  ``POST /api/generate``, NDJSON streams ending with a ``"done": true`` line and its statistics,
  or one JSON object with ``"stream": false``; ``GET /api/tags``, ``GET /api/version``. No
  request id, as Ollama sends none.

Every route follows the same :class:`Profile`: the time to the first byte, tokens per second,
every ``rate_limit_every``-th request (counted over all routes) a 429 with ``retry-after``
(and ``retry-after-ms`` on the OpenAI route, as OpenAI sends it), a share ``error_rate`` of
requests a 500. An unknown path is a 404 with an error in OpenAI's shape. Over TLS, a throwaway
certificate authority (``trustme``) signs the server's certificate, and a front that holds each
ClientHello for ``tls_delay`` seconds makes the handshake as slow as a far server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from llm_latency.testing import mock_anthropic, mock_ollama, mock_openai
from llm_latency.testing.mock_common import STATE, Profile, ServerState, log_to_stderr

__all__ = [
    "STATE",
    "Certificates",
    "HandshakeDelay",
    "Profile",
    "RunningServer",
    "ServerState",
    "log_to_stderr",
    "make_app",
    "make_certificates",
    "running",
]

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _json_errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Unknown paths and methods get a JSON 404 in OpenAI's shape, not aiohttp's text page."""
    try:
        return await handler(request)
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed):
        return mock_openai.not_found(request)


async def _models(request: web.Request) -> web.Response:
    # Both SDKs list models at this path; the anthropic SDK always sends anthropic-version.
    if "anthropic-version" in request.headers:
        return mock_anthropic.models()
    return mock_openai.models()


def make_app(profile: Profile) -> web.Application:
    """The aiohttp application of the mock server."""
    app = web.Application(middlewares=[_json_errors])
    state = ServerState(profile)
    if profile.seed is not None:
        state.rng.seed(profile.seed)
    app[STATE] = state
    app.router.add_post("/v1/chat/completions", mock_openai.chat_completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/messages", mock_anthropic.messages)
    app.router.add_post("/api/chat", mock_ollama.chat)
    app.router.add_post("/api/generate", mock_ollama.generate)
    app.router.add_get("/api/tags", mock_ollama.tags)
    app.router.add_get("/api/version", mock_ollama.version)
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
            await self._forward(reader, writer)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Relay one connection: its first bytes ``delay`` late, then everything as it comes
        (a subclass may shape the relay otherwise)."""
        first = await reader.read(65536)
        await asyncio.sleep(self._delay)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target_port)
        up_writer.write(first)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


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
