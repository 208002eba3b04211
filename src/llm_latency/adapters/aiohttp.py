"""The aiohttp adapter: every phase of every attempt made through a ``ClientSession``.

How each phase is observed (all hooks are on classes, so sessions created before
``instrument()`` are covered, and all are undone by ``uninstrument()``; each group of hooks
degrades on its own when aiohttp changes, see ``_patching``):

- an *attempt* starts in ``BaseConnector.connect`` (once per physical request: redirects and
  aiohttp's own retry on a dropped pooled connection each make a new one); the request span is
  started there and ``traceparent`` is written into the request's headers;
- ``queue``: ``BaseConnector._wait_for_available_connection`` (the pool limit was reached);
- ``dns``: ``TCPConnector._resolve_host`` when the name is not in aiohttp's DNS cache;
- ``connect``: from ``TCPConnector._wrap_create_connection`` to the end of
  ``aiohappyeyeballs.start_connection`` (the TCP socket is up);
- ``tls``: from there to the end of ``_wrap_create_connection`` (the handshake is done);
- through a proxy (``TCPConnector._create_proxy_connection``), ``dns`` and ``connect`` are the
  proxy's; for an HTTPS target, ``proxy`` lasts from the TCP connection to the proxy until the
  proxy answered the ``CONNECT`` (that exchange is not the attempt's send, wait and receive),
  and ``tls`` is ``_start_tls_connection``, the handshake with the target through the tunnel;
- ``send``: ``ClientRequest.send`` until the request body's writer task is done;
- ``wait``: from then until ``ClientResponse.start`` has parsed the response headers;
- ``receive``: from the headers until the body's EOF reaches the response's ``StreamReader``
  (however the program consumes it), or until the response is released or closed, or the
  connection fails. Chunk arrival times come from ``StreamReader.feed_data``.

The connection pool (``pools``): a connection opens at the end of ``_wrap_create_connection``
and closes at ``ResponseHandler.connection_lost``; the connector is read when the SDK collects.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from contextvars import ContextVar
from functools import partial
from typing import Any, Final

from aiohttp.client_exceptions import ClientConnectionError
from opentelemetry.trace import Span

from llm_latency import forks
from llm_latency.adapters._hooks import SKIP, Hook, Tap, phase_hook
from llm_latency.adapters._patching import PatchSet, Unavailable
from llm_latency.adapters._resolver import is_ip_literal, peer_address, socket_peer
from llm_latency.clock import clock_ns
from llm_latency.emitter import Emitter
from llm_latency.headers import request_resend_count
from llm_latency.live_state import register
from llm_latency.pools import ConnectionLifetimes, HostPort, PoolRow
from llm_latency.suppression import tracing_allowed
from llm_latency.timeline import (
    CONNECT,
    DNS,
    PROXY,
    QUEUE,
    RECEIVE,
    SEND,
    TLS,
    WAIT,
    Timeline,
)

_SESSION: Final = "aiohttp.client:ClientSession"
_BASE_CONNECTOR: Final = "aiohttp.connector:BaseConnector"
_TCP_CONNECTOR: Final = "aiohttp.connector:TCPConnector"
_REQUEST: Final = "aiohttp.client_reqrep:ClientRequest"
_RESPONSE: Final = "aiohttp.client_reqrep:ClientResponse"
_PROTOCOL: Final = "aiohttp.client_proto:ResponseHandler"
_READER: Final = "aiohttp.streams:StreamReader"


class _SessionRequest:
    """One ``ClientSession._request`` call: its attempt in flight and how many it made."""

    __slots__ = ("attempt", "attempts", "last", "tls_expected", "tunnel")

    def __init__(self) -> None:
        self.attempt: Timeline | None = None
        self.last: Span | None = None  # the request span of the attempt before
        self.attempts = 0
        self.tls_expected = False
        #: A proxy's CONNECT tunnel is being opened: its exchange is no request of the program's.
        self.tunnel = False


_session_request: ContextVar[_SessionRequest | None] = ContextVar(
    "llm_latency_aiohttp_call", default=None
)

# An attempt has one owner at a time, where its hooks find it: until the response headers, the
# ``ClientSession._request`` call running in this task (``_session_request``); from the
# headers on, its response body stream, here (the body arrives in the connection's callbacks,
# outside the request's task). StreamReader has __slots__, so the attempt cannot ride on the
# stream itself. Keyed by the stream's id, not the stream: a stream holds its loop, its
# connection's socket and, by a read's waiter, the task reading it, and a program that drops
# its loop unclosed with a body unread drops them all. The entry goes with the stream: the
# response's release, close or collection (``__del__``, hooked) ends its attempt first.
_streams: dict[int, Timeline] = {}
# A forked child's streams are its own: the parent's attempts are not the child's to end.
forks.at_fork(_streams.clear)
register("aiohttp_streams", lambda: len(_streams))


def _forget_streams(attempts: Collection[Timeline]) -> None:
    """The emitter forgot ``attempts`` (their loop closed or went first): their streams'
    entries go too, now rather than when the program lets go of the responses."""
    if attempts:
        for key, attempt in list(_streams.items()):
            if attempt in attempts:
                _streams.pop(key, None)


def _reset(token: Any) -> None:
    """The request's context variable back as it was, where it can be, on the failure path: a
    request whose task was destroyed (its loop closed with it in flight) is unwound by the
    collector, outside the task's context, and the request still ends."""
    with contextlib.suppress(ValueError):  # "created in a different Context"
        _session_request.reset(token)


def _attempt_in_flight() -> Timeline | None:
    call = _session_request.get()
    return None if call is None else call.attempt


def _is_dns_cached(conn: Any, host: str, port: int) -> bool:
    """Whether ``_resolve_host`` will answer without a lookup (an IP literal or a cache hit)."""
    if is_ip_literal(host):
        return True
    if not conn._use_dns_cache:
        return False
    key = (host, port)
    cached = conn._cached_hosts
    return key in cached and not cached.expired(key)


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs[name]


class AiohttpAdapter:
    """Hooks aiohttp's client classes to fill a Timeline per attempt."""

    name = "aiohttp"

    def __init__(self, emitter: Emitter) -> None:
        self._emitter = emitter
        self._patches = PatchSet("aiohttp", emitter.failed_once)

    @property
    def lost(self) -> list[str]:
        """What could not be hooked in this aiohttp version."""
        return self._patches.lost

    # -- install ------------------------------------------------------------------------------

    def install(self) -> None:
        """Hook aiohttp (idempotence is the instrumentor's job). Raises :class:`Unavailable`
        when the request span itself cannot be observed."""
        p = self._patches
        done = Hook(self._response_done)
        request = Hook(_request_begins, self._request_returns, self._request_fails)
        if not p.group(
            "request spans",
            [
                (_SESSION, "_request", request),
                (_BASE_CONNECTOR, "connect", Hook(self._attempt_begins, error=_attempt_fails)),
                (
                    _RESPONSE,
                    "start",
                    Hook(_response_starts, self._headers_in, _response_fails, self._abandon),
                ),
                (_RESPONSE, "release", done),
                (_RESPONSE, "close", done),
                (_RESPONSE, "__del__", done),
                (_PROTOCOL, "close", Hook(self._connection_closes)),
                (_PROTOCOL, "abort", Hook(self._connection_closes)),
                (_READER, "set_exception", Hook(self._body_fails)),
                (_READER, "_wait", Hook(_body_read, error=self._body_read_fails)),
            ],
        ):
            raise Unavailable(p.lost)
        p.group(
            "the queue phase",
            [(_BASE_CONNECTOR, "_wait_for_available_connection", phase_hook(QUEUE, _attempt_of))],
        )
        p.group("the dns phase", [(_TCP_CONNECTOR, "_resolve_host", phase_hook(DNS, _resolving))])
        p.group(
            "the connect and tls phases, and the connection pool",
            [
                (_TCP_CONNECTOR, "_wrap_create_connection", Hook(_connecting, self._connected)),
                ("aiohappyeyeballs", "start_connection", Hook(_tcp_connecting, _tcp_connected)),
                (_PROTOCOL, "connection_lost", Hook(self._emitter.pools.lifetimes.on_close)),
            ],
        )
        p.group(
            "proxies",
            [
                (
                    _TCP_CONNECTOR,
                    "_create_proxy_connection",
                    Hook(_proxy_begins, self._proxy_connected, _proxy_fails),
                ),
                (_TCP_CONNECTOR, "_start_tls_connection", phase_hook(TLS, _tunnel_tls)),
            ],
        )
        p.group("connection reuse", [(_BASE_CONNECTOR, "_get", Hook(_found, _pooled))])
        p.group("the send and wait phases", [(_REQUEST, "send", Hook(_send_begins, self._sent))])
        p.group("body chunk times", [(_READER, "feed_data", Tap(_chunk, argument="data"))])
        self._emitter.on_forget.append(_forget_streams)

    def uninstall(self) -> None:
        """Undo every hook. The emitter ends the attempts still in flight."""
        self._patches.restore()
        _streams.clear()
        if _forget_streams in self._emitter.on_forget:
            self._emitter.on_forget.remove(_forget_streams)

    # -- the call and the attempt -------------------------------------------------------------

    def _end_before_headers(
        self, call: _SessionRequest, error: BaseException | None = None
    ) -> None:
        """End the attempt the request still owns, if any. ``error``: what the program sees,
        which replaces what the attempt recorded (aiohttp wraps OSErrors, and turns the
        cancellation of its total timeout into a TimeoutError)."""
        attempt, call.attempt = call.attempt, None
        if attempt is None:
            return
        if error is not None:
            if attempt.error is None:
                attempt.fail(error)
            else:
                attempt.error = error
        self._emitter.finish(attempt)

    def _end_body(self, stream: Any, error: BaseException | None = None) -> None:
        """End the attempt the body ``stream`` owns, if any (whichever of the stream's end,
        the response's release or close, a failed read or the connection's close comes
        first; the others then find nothing)."""
        attempt = _streams.pop(id(stream), None)
        if attempt is None:
            return
        if error is None:
            self._emitter.finish(attempt)
        else:
            self._emitter.finish_failed(attempt, error)

    def _request_returns(self, state: tuple[_SessionRequest, Any], result: Any) -> Any:
        call, token = state
        _session_request.reset(token)
        # Never handed to its response (a fault in between): nothing else will end it.
        self._end_before_headers(call)
        return result

    def _request_fails(self, state: tuple[_SessionRequest, Any], exc: BaseException) -> None:
        call, token = state
        _reset(token)
        self._end_before_headers(call, exc)

    def _attempt_begins(self, conn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call = _session_request.get()
        if call is None:
            return SKIP
        # An attempt still owned here: aiohttp retried on its own after it failed (a dropped
        # pooled connection); the failure was swallowed, the attempt still ends here.
        self._end_before_headers(call)
        req = _arg(args, kwargs, 0, "req")
        url = req.url
        attempt = Timeline(req.method, str(url))
        attempt.client = "aiohttp"
        attempt.resend_count = call.attempts + request_resend_count(req.headers)
        if req.proxy is not None:
            attempt.proxy_url = str(req.proxy)
        call.attempts += 1
        call.last = self._emitter.start(
            attempt,
            url.raw_host or "",
            url.port,
            url.raw_path,
            req.headers,
            call.last,
            on_loop=True,
        )
        call.attempt = attempt
        return attempt

    def _abandon(self, state: tuple[_SessionRequest, Timeline, Any]) -> None:
        self._end_before_headers(state[0])

    # -- request and response -----------------------------------------------------------------

    def _sent(self, state: tuple[Timeline, Any], response: Any) -> Any:
        attempt, req = state
        writer = req._writer
        if writer is None:
            _request_sent(attempt)
        else:
            writer.add_done_callback(partial(self._body_written, attempt))
        return response

    def _body_written(self, attempt: Timeline, _task: Any) -> None:
        try:
            _request_sent(attempt)
        except Exception:
            self._emitter.failed_once("aiohttp request body")

    def _headers_in(self, state: tuple[_SessionRequest, Timeline, Any], result: Any) -> Any:
        call, attempt, response = state
        call.attempt = None
        content = response.content
        # From here on the body stream owns the attempt (before anything here can fail: the
        # response's release or close then still ends it).
        _streams[id(content)] = attempt
        _headers_received(attempt, response)
        if content.is_eof():  # no body, or all of it came with the headers
            self._end_body(content)
        else:
            content.on_eof(partial(self._end_body, content))
        return result

    def _response_done(self, response: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._end_body(response.content)

    def _body_read_fails(self, stream: Any, exc: BaseException) -> None:
        # The program's read of the body was cancelled or timed out: the attempt ends here, in
        # the receive phase, with what the program sees.
        self._end_body(stream, exc)

    def _connection_closes(
        self, protocol: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        # Closing the connection (the session or connector closing) drops the body stream
        # without telling it: the attempt ends here, cut short.
        payload = protocol._payload
        if payload is None or id(payload) not in _streams:
            return
        # A body that ends at the close (no length, not chunked) is complete: feed_eof marks
        # the stream before its callbacks release the connection.
        self._end_body(
            payload, None if payload.is_eof() else ClientConnectionError("Connection closed")
        )

    # -- the connection pool ------------------------------------------------------------------

    def _connected(self, state: tuple[Timeline | None, Any, Any], result: Any) -> Any:
        attempt, connector, req = state
        if attempt is not None:
            current = attempt.current_phase
            if current in (TLS, CONNECT):
                attempt.end_phase(current)
        if req is not None:
            key = req.connection_key
            pools = self._emitter.pools
            pools.lifetimes.opened(result[1], key.host, key.port)
            pools.watch(connector, _read_connector)
        return result

    def _proxy_connected(self, state: tuple[_SessionRequest, Any, Any], result: Any) -> Any:
        call, connector, req = state
        call.tunnel = False
        # The connection the request runs on (through a tunnel, a new protocol over the
        # proxy's socket, which never hears of the close), counted under the target like a
        # direct one.
        pools = self._emitter.pools
        pools.lifetimes.opened(result[1], req.host, req.port)
        pools.watch(connector, _read_connector)
        return result

    def _body_fails(self, stream: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._end_body(stream, _arg(args, kwargs, 0, "exc"))


# -- hooks that need no emitter ------------------------------------------------------------------


def _request_begins(session: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not tracing_allowed():
        return SKIP
    call = _SessionRequest()
    return call, _session_request.set(call)


def _attempt_fails(attempt: Timeline, exc: BaseException) -> None:
    attempt.fail(exc)


def _found(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    attempt = _attempt_in_flight()
    return SKIP if attempt is None else attempt


def _pooled(attempt: Timeline, connection: Any) -> Any:
    attempt.reused = connection is not None
    return connection


def _attempt_of(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _attempt_in_flight()


def _resolving(conn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The attempt whose host ``_resolve_host`` looks up, unless it answers without a lookup."""
    attempt = _attempt_in_flight()
    host, port = _arg(args, kwargs, 0, "host"), _arg(args, kwargs, 1, "port")
    return None if attempt is None or _is_dns_cached(conn, host, port) else attempt


def _connecting(conn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = _session_request.get()
    attempt = None if call is None else call.attempt
    if call is not None and attempt is not None:
        call.tls_expected = bool(kwargs.get("ssl"))
        # Another address after a failed one: the phase goes on from its first start.
        attempt.resume(CONNECT)
    # The connection to a proxy's tunnel is counted once the tunnel is up (_proxy_connected).
    tunnel = call is not None and call.tunnel
    return attempt, conn, None if tunnel else kwargs.get("req")


def _proxy_begins(conn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = _session_request.get()
    if call is None:
        return SKIP
    req = _arg(args, kwargs, 0, "req")
    call.tunnel = req.is_ssl()
    return call, conn, req


def _proxy_fails(state: tuple[_SessionRequest, Any, Any], exc: BaseException) -> None:
    state[0].tunnel = False


def _tunnel_tls(conn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The attempt whose tunnel is up: the handshake with the target begins."""
    attempt = _attempt_in_flight()
    if attempt is not None and attempt.current_phase == PROXY:
        attempt.end_phase(PROXY)
    return attempt


def _tcp_connecting(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = _session_request.get()
    return SKIP if call is None or call.attempt is None else call


def _tcp_connected(call: _SessionRequest, sock: Any) -> Any:
    attempt = call.attempt
    if attempt is not None and attempt.current_phase == CONNECT:
        now = clock_ns()
        attempt.end_phase(CONNECT, now)
        attempt.peer_address = socket_peer(sock)
        if call.tunnel:
            attempt.begin(PROXY, now)
        elif call.tls_expected:
            attempt.begin(TLS, now)
    return sock


def _send_begins(req: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = _session_request.get()
    attempt = None if call is None or call.tunnel else call.attempt
    if attempt is None:
        return SKIP
    if attempt.peer_address is None:  # a pooled connection
        transport = _arg(args, kwargs, 0, "conn").transport
        if transport is not None:
            attempt.peer_address = peer_address(transport.get_extra_info("peername"))
    if attempt.current_phase == PROXY:  # the tunnel's handshake was not seen
        attempt.advance(SEND)
    else:
        attempt.begin(SEND)
    return attempt, req


def _response_starts(response: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = _session_request.get()
    attempt = None if call is None or call.tunnel else call.attempt
    if call is None or attempt is None:
        return SKIP
    return call, attempt, response


def _response_fails(state: tuple[_SessionRequest, Timeline, Any], exc: BaseException) -> None:
    state[1].fail(exc)


def _body_read(stream: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # Asked per read: whether the stream is an attempt's is left to the failure, where
    # ``_end_body`` finds it or not.
    return stream


def _chunk(stream: Any, data: bytes) -> None:
    """A body chunk reached a response's ``StreamReader`` (a ``Tap``: per chunk, kept cheap)."""
    if data:
        attempt = _streams.get(id(stream))
        if attempt is not None:
            attempt.chunk(data)


def _read_connector(connector: Any, lifetimes: ConnectionLifetimes) -> Iterator[PoolRow]:
    """One ``BaseConnector``'s connections per host: idle ones wait in ``_conns`` (by
    connection key), active ones are in ``_acquired`` (their host is the one they opened to)."""
    if connector.closed:
        return
    limits = [n for n in (connector.limit, connector.limit_per_host) if n]
    limit = min(limits) if limits else None
    rows: dict[HostPort, list[int]] = {}
    for key, entries in list(connector._conns.items()):
        idle = sum(1 for proto, _ in list(entries) if lifetimes.is_open(proto))
        if idle:
            rows.setdefault((key.host, key.port), [0, 0])[1] += idle
    for proto in list(connector._acquired):
        host = lifetimes.host_of(proto)  # None for the placeholder of a connection being opened
        if host is not None:
            rows.setdefault(host, [0, 0])[0] += 1
    for host, (active, idle) in rows.items():
        yield host, active, idle, limit


def _request_sent(attempt: Timeline) -> None:
    if attempt.current_phase == SEND:
        attempt.advance(WAIT)


def _headers_received(attempt: Timeline, response: Any) -> None:
    attempt.advance(RECEIVE)
    attempt.status_code = response.status
    version = response.version
    if version is not None:
        attempt.protocol_version = f"{version.major}.{version.minor}"
    attempt.response_headers = response.raw_headers
    # aiohttp decompresses before the StreamReader, where the chunks are seen.
    attempt.response_body(response.headers.get("Content-Type"))
    # Body bytes that came in the same reads as the headers are already buffered.
    for chunk in getattr(response.content, "_buffer", ()):
        attempt.chunk(chunk)
