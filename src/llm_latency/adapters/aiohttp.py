"""The aiohttp adapter: every phase of every attempt made through a ``ClientSession``.

How each phase is observed (all patches are on classes, so sessions created before
``instrument()`` are covered, and all are undone by ``uninstrument()``):

- an *attempt* starts in ``BaseConnector.connect`` (once per physical request: redirects and
  aiohttp's own retry on a dropped pooled connection each make a new one); the request span is
  started there and ``traceparent`` is written into the request's headers;
- ``queue``: ``BaseConnector._wait_for_available_connection`` (the pool limit was reached);
- ``dns``: ``TCPConnector._resolve_host`` when the name is not in aiohttp's DNS cache;
- ``connect``: from ``TCPConnector._wrap_create_connection`` to the end of
  ``aiohappyeyeballs.start_connection`` (the TCP socket is up);
- ``tls``: from there to the end of ``_wrap_create_connection`` (the handshake is done);
- ``send``: ``ClientRequest.send`` until the request body's writer task is done;
- ``wait``: from then until ``ClientResponse.start`` has parsed the response headers;
- ``receive``: from the headers until the body's EOF reaches the response's ``StreamReader``
  (however the program consumes it), or until the response is released or closed, or the
  connection fails. Chunk arrival times come from ``StreamReader.feed_data``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from functools import partial
from typing import Any, Final

import aiohappyeyeballs
from aiohttp import client_proto, client_reqrep, connector, streams
from aiohttp.client import ClientSession
from aiohttp.client_exceptions import ClientConnectionError
from aiohttp.helpers import is_ip_address

from llm_latency.adapters._patching import Patches
from llm_latency.emitter import Emitter
from llm_latency.sse import SSECounter
from llm_latency.suppression import tracing_allowed
from llm_latency.timeline import (
    CONNECT,
    DNS,
    QUEUE,
    RECEIVE,
    SEND,
    TLS,
    WAIT,
    Timeline,
    _now,
)

RETRY_COUNT_HEADER: Final = "x-stainless-retry-count"
_TIMELINE_ATTR: Final = "_llm_latency_timeline"


class _Call:
    """One ``ClientSession._request`` call: its attempt in flight and how many it made."""

    __slots__ = ("attempt", "attempts", "last", "tls_expected")

    def __init__(self) -> None:
        self.attempt: Timeline | None = None
        self.last: Timeline | None = None
        self.attempts = 0
        self.tls_expected = False


_call: ContextVar[_Call | None] = ContextVar("llm_latency_aiohttp_call", default=None)

# Response body streams being watched, to their attempt. StreamReader has __slots__, so the
# attempt cannot ride on the stream itself.
_streams: dict[streams.StreamReader, Timeline] = {}


def _current() -> Timeline | None:
    call = _call.get()
    return None if call is None else call.attempt


def _retry_count(headers: Any) -> int:
    value = headers.get(RETRY_COUNT_HEADER)
    if value is None:
        return 0
    try:
        return max(int(value), 0)
    except ValueError:
        return 0


def _is_dns_cached(conn: Any, host: str, port: int) -> bool:
    """Whether ``_resolve_host`` will answer without a lookup (an IP literal or a cache hit)."""
    if is_ip_address(host):
        return True
    if not conn._use_dns_cache:
        return False
    key = (host, port)
    cached = conn._cached_hosts
    return key in cached and not cached.expired(key)


class AiohttpAdapter:
    """Patches aiohttp's client classes to fill a Timeline per attempt."""

    name = "aiohttp"

    def __init__(self, emitter: Emitter) -> None:
        self._emitter = emitter
        self._patches = Patches()

    # -- install ------------------------------------------------------------------------------

    def install(self) -> None:
        """Patch aiohttp (idempotence is the instrumentor's job)."""
        p = self._patches
        p.replace(ClientSession, "_request", self._wrap_request(ClientSession._request))
        base = connector.BaseConnector
        p.replace(base, "connect", self._wrap_connect(base.connect))
        p.replace(base, "_get", self._wrap_get(base._get))
        p.replace(
            base,
            "_wait_for_available_connection",
            self._wrap_phase(base._wait_for_available_connection, QUEUE),
        )
        tcp = connector.TCPConnector
        p.replace(tcp, "_resolve_host", self._wrap_resolve_host(tcp._resolve_host))
        p.replace(
            tcp,
            "_wrap_create_connection",
            self._wrap_create_connection(tcp._wrap_create_connection),
        )
        p.replace(
            aiohappyeyeballs,
            "start_connection",
            self._wrap_start_connection(aiohappyeyeballs.start_connection),
        )
        request = client_reqrep.ClientRequest
        p.replace(request, "send", self._wrap_send(request.send))
        response = client_reqrep.ClientResponse
        p.replace(response, "start", self._wrap_start(response.start))
        p.replace(response, "release", self._wrap_release(response.release))
        p.replace(response, "close", self._wrap_release(response.close))
        p.replace(response, "__del__", self._wrap_del(response.__del__))
        protocol = client_proto.ResponseHandler
        p.replace(protocol, "close", self._wrap_protocol_close(protocol.close))
        p.replace(protocol, "abort", self._wrap_protocol_close(protocol.abort))
        reader = streams.StreamReader
        p.replace(reader, "feed_data", self._wrap_feed_data(reader.feed_data))
        p.replace(reader, "set_exception", self._wrap_set_exception(reader.set_exception))
        p.replace(reader, "_wait", self._wrap_wait(reader._wait))

    def uninstall(self) -> None:
        """Undo every patch. The emitter ends the attempts still in flight."""
        self._patches.restore()
        _streams.clear()

    # -- the call and the attempt -------------------------------------------------------------

    def _wrap_request(self, original: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        emitter = self._emitter

        async def _request(session: Any, *args: Any, **kwargs: Any) -> Any:
            if not tracing_allowed():
                return await original(session, *args, **kwargs)
            call = _Call()
            token = _call.set(call)
            try:
                return await original(session, *args, **kwargs)
            except BaseException as exc:
                attempt = call.attempt
                if attempt is not None and not attempt.ended:
                    # Report what the program sees (aiohttp wraps OSErrors, and turns the
                    # cancellation of its total timeout into a TimeoutError).
                    if attempt.error is None:
                        attempt.fail(exc)
                    else:
                        attempt.error = exc
                    emitter.finish(attempt)
                raise
            finally:
                _call.reset(token)

        return _request

    def _wrap_connect(self, original: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        emitter = self._emitter

        async def connect(conn: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
            call = _call.get()
            if call is None:
                return await original(conn, req, *args, **kwargs)
            previous = call.attempt
            if previous is not None and not previous.ended:
                # aiohttp retried on its own after this attempt failed (a dropped pooled
                # connection): the failure was swallowed, the attempt still ends here.
                emitter.finish(previous)
            attempt = None
            try:
                url = req.url
                attempt = Timeline(req.method, str(url))
                attempt.resend_count = call.attempts + _retry_count(req.headers)
                call.attempts += 1
                emitter.start(
                    attempt, url.raw_host or "", url.port, url.raw_path, req.headers, call.last
                )
                call.last = attempt
            except Exception:
                emitter.failed_once("aiohttp connect")
                attempt = None
            call.attempt = attempt
            if attempt is None:
                return await original(conn, req, *args, **kwargs)
            try:
                return await original(conn, req, *args, **kwargs)
            except BaseException as exc:
                attempt.fail(exc)
                raise

        return connect

    # -- connection phases --------------------------------------------------------------------

    def _wrap_get(self, original: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        async def _get(conn: Any, key: Any, *args: Any, **kwargs: Any) -> Any:
            result = await original(conn, key, *args, **kwargs)
            attempt = _current()
            if attempt is not None:
                attempt.reused = result is not None
            return result

        return _get

    def _wrap_phase(
        self, original: Callable[..., Awaitable[Any]], phase: int
    ) -> Callable[..., Any]:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            attempt = _current()
            if attempt is None:
                return await original(*args, **kwargs)
            attempt.begin(phase)
            result = await original(*args, **kwargs)
            attempt.finish(phase)
            return result

        return timed

    def _wrap_resolve_host(self, original: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        async def _resolve_host(conn: Any, host: str, port: int, *args: Any, **kw: Any) -> Any:
            attempt = _current()
            if attempt is None:
                return await original(conn, host, port, *args, **kw)
            try:
                cached = _is_dns_cached(conn, host, port)
            except Exception:
                cached = False
            if cached:
                return await original(conn, host, port, *args, **kw)
            attempt.begin(DNS)
            result = await original(conn, host, port, *args, **kw)
            attempt.finish(DNS)
            return result

        return _resolve_host

    def _wrap_create_connection(
        self, original: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Any]:
        async def _wrap_create_connection(conn: Any, *args: Any, **kwargs: Any) -> Any:
            call = _call.get()
            attempt = None if call is None else call.attempt
            if call is None or attempt is None:
                return await original(conn, *args, **kwargs)
            call.tls_expected = bool(kwargs.get("ssl"))
            # Another address after a failed one: the phase goes on from its first start.
            attempt.resume(CONNECT)
            result = await original(conn, *args, **kwargs)
            current = attempt.current_phase
            if current in (TLS, CONNECT):
                attempt.finish(current)
            return result

        return _wrap_create_connection

    def _wrap_start_connection(self, original: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        async def start_connection(*args: Any, **kwargs: Any) -> Any:
            sock = await original(*args, **kwargs)
            call = _call.get()
            if call is not None:
                attempt = call.attempt
                if attempt is not None and attempt.current_phase == CONNECT:
                    now = _now()
                    attempt.finish(CONNECT, now)
                    if call.tls_expected:
                        attempt.begin(TLS, now)
            return sock

        return start_connection

    # -- request and response -----------------------------------------------------------------

    def _wrap_send(self, original: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        async def send(req: Any, conn: Any) -> Any:
            attempt = _current()
            if attempt is None:
                return await original(req, conn)
            attempt.begin(SEND)
            response = await original(req, conn)
            writer = req._writer
            if writer is None:
                _request_sent(attempt)
            else:
                writer.add_done_callback(partial(_body_written, attempt))
            return response

        return send

    def _wrap_start(self, original: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        emitter = self._emitter

        async def start(response: Any, connection: Any) -> Any:
            call = _call.get()
            attempt = None if call is None else call.attempt
            if call is None or attempt is None:
                return await original(response, connection)
            try:
                result = await original(response, connection)
            except BaseException as exc:
                attempt.fail(exc)
                raise
            call.attempt = None  # from here on the response owns the attempt
            try:
                _headers_received(attempt, response)
            except Exception:
                emitter.failed_once("aiohttp response start")
                emitter.finish(attempt)
                return result
            content = response.content
            if content.is_eof() or type(content) is streams.EmptyStreamReader:
                emitter.finish(attempt)
            else:
                _streams[content] = attempt
                content.on_eof(partial(_body_complete, emitter, attempt, content))
            return result

        return start

    def _wrap_release(self, original: Callable[..., Any]) -> Callable[..., Any]:
        emitter = self._emitter

        def release(response: Any) -> Any:
            attempt: Timeline | None = response.__dict__.get(_TIMELINE_ATTR)
            if attempt is not None and not attempt.ended:
                _streams.pop(response.content, None)
                emitter.finish(attempt)
            return original(response)

        return release

    def _wrap_wait(self, original: Callable[..., Awaitable[None]]) -> Callable[..., Any]:
        emitter = self._emitter

        async def _wait(stream: Any, func_name: str) -> None:
            try:
                await original(stream, func_name)
            except BaseException as exc:
                # The program's read of the body was cancelled or timed out: the attempt
                # ends here, in the receive phase, with what the program sees.
                attempt = _streams.pop(stream, None)
                if attempt is not None and not attempt.ended:
                    attempt.fail(exc)
                    emitter.finish(attempt)
                raise

        return _wait

    def _wrap_del(self, original: Callable[..., Any]) -> Callable[..., Any]:
        emitter = self._emitter

        def __del__(response: Any, *args: Any, **kwargs: Any) -> Any:
            attempt: Timeline | None = response.__dict__.get(_TIMELINE_ATTR)
            if attempt is not None and not attempt.ended:
                _streams.pop(response.content, None)
                emitter.finish(attempt)
            return original(response, *args, **kwargs)

        return __del__

    def _wrap_feed_data(self, original: Callable[..., bool]) -> Callable[..., bool]:
        def feed_data(stream: Any, data: bytes, *args: Any) -> bool:
            attempt = _streams.get(stream)
            if attempt is not None and data:
                attempt.chunk(data)
            return original(stream, data, *args)

        return feed_data

    def _wrap_protocol_close(self, original: Callable[..., None]) -> Callable[..., None]:
        emitter = self._emitter

        def close(protocol: Any) -> None:
            # Closing the connection (the session or connector closing) drops the body stream
            # without telling it: the attempt ends here, cut short.
            payload = protocol._payload
            if payload is not None:
                attempt = _streams.pop(payload, None)
                if attempt is not None and not attempt.ended:
                    # A body that ends at the close (no length, not chunked) is complete:
                    # feed_eof marks the stream before its callbacks release the connection.
                    if not payload.is_eof():
                        attempt.fail(_connection_closed())
                    emitter.finish(attempt)
            original(protocol)

        return close

    def _wrap_set_exception(self, original: Callable[..., None]) -> Callable[..., None]:
        emitter = self._emitter

        def set_exception(stream: Any, exc: BaseException, *args: Any, **kwargs: Any) -> None:
            attempt = _streams.pop(stream, None)
            if attempt is not None and not attempt.ended:
                attempt.fail(exc)
                emitter.finish(attempt)
            original(stream, exc, *args, **kwargs)

        return set_exception


def _connection_closed() -> BaseException:
    return ClientConnectionError("Connection closed")


def _request_sent(attempt: Timeline) -> None:
    if attempt.current_phase == SEND:
        now = _now()
        attempt.finish(SEND, now)
        attempt.begin(WAIT, now)


def _body_written(attempt: Timeline, _task: Any) -> None:
    _request_sent(attempt)


def _headers_received(attempt: Timeline, response: Any) -> None:
    now = _now()
    current = attempt.current_phase
    if current in (WAIT, SEND):
        attempt.finish(current, now)
    attempt.begin(RECEIVE, now)
    attempt.status_code = response.status
    version = response.version
    if version is not None:
        attempt.protocol_version = f"{version.major}.{version.minor}"
    attempt.response_headers = response.raw_headers
    if response.headers.get("Content-Type", "").startswith("text/event-stream"):
        attempt.sse = SSECounter()
    response.__dict__[_TIMELINE_ATTR] = attempt
    # Body bytes that came in the same reads as the headers are already buffered.
    for chunk in getattr(response.content, "_buffer", ()):
        attempt.chunk(chunk)


def _body_complete(emitter: Emitter, attempt: Timeline, content: streams.StreamReader) -> None:
    _streams.pop(content, None)
    emitter.finish(attempt)
