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

from functools import partial
from typing import Any, Final

from aiohttp.client_exceptions import ClientConnectionError

from llm_latency.adapters._aiohttp_attempt import (
    SessionRequest,
    arg,
    attempt_fails,
    body_chunk,
    body_read,
    forget_streams,
    headers_received,
    request_begins,
    request_sent,
    reset,
    response_fails,
    response_starts,
    send_begins,
    session_request,
    streams,
)
from llm_latency.adapters._aiohttp_connection import (
    attempt_of,
    connecting,
    found,
    pooled,
    proxy_begins,
    proxy_fails,
    read_connector,
    resolving,
    tcp_connected,
    tcp_connecting,
    tunnel_tls,
)
from llm_latency.adapters._hooks import SKIP, Hook, Tap, phase_hook
from llm_latency.adapters._patching import PatchSet, Unavailable
from llm_latency.emitter import Emitter
from llm_latency.headers import CONNECTION_CLOSE, asks_to_close, request_resend_count
from llm_latency.timeline import CONNECT, DNS, QUEUE, TLS, Timeline

_SESSION: Final = "aiohttp.client:ClientSession"
_BASE_CONNECTOR: Final = "aiohttp.connector:BaseConnector"
_TCP_CONNECTOR: Final = "aiohttp.connector:TCPConnector"
_REQUEST: Final = "aiohttp.client_reqrep:ClientRequest"
_RESPONSE: Final = "aiohttp.client_reqrep:ClientResponse"
_PROTOCOL: Final = "aiohttp.client_proto:ResponseHandler"
_READER: Final = "aiohttp.streams:StreamReader"


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
        request = Hook(request_begins, self._request_returns, self._request_fails)
        if not p.group(
            "request spans",
            [
                (_SESSION, "_request", request),
                (_BASE_CONNECTOR, "connect", Hook(self._attempt_begins, error=attempt_fails)),
                (
                    _RESPONSE,
                    "start",
                    Hook(response_starts, self._headers_in, response_fails, self._abandon),
                ),
                (_RESPONSE, "release", done),
                (_RESPONSE, "close", done),
                (_RESPONSE, "__del__", done),
                (_PROTOCOL, "close", Hook(self._connection_closes)),
                (_PROTOCOL, "abort", Hook(self._connection_closes)),
                (_READER, "set_exception", Hook(self._body_fails)),
                (_READER, "_wait", Hook(body_read, error=self._body_read_fails)),
            ],
        ):
            raise Unavailable(p.lost)
        p.group(
            "the queue phase",
            [(_BASE_CONNECTOR, "_wait_for_available_connection", phase_hook(QUEUE, attempt_of))],
        )
        p.group("the dns phase", [(_TCP_CONNECTOR, "_resolve_host", phase_hook(DNS, resolving))])
        p.group(
            "the connect and tls phases, and the connection pool",
            [
                (_TCP_CONNECTOR, "_wrap_create_connection", Hook(connecting, self._connected)),
                ("aiohappyeyeballs", "start_connection", Hook(tcp_connecting, tcp_connected)),
                (_PROTOCOL, "connection_lost", Hook(self._emitter.pools.lifetimes.on_close)),
            ],
        )
        p.group(
            "proxies",
            [
                (
                    _TCP_CONNECTOR,
                    "_create_proxy_connection",
                    Hook(proxy_begins, self._proxy_connected, proxy_fails),
                ),
                (_TCP_CONNECTOR, "_start_tls_connection", phase_hook(TLS, tunnel_tls)),
            ],
        )
        p.group("connection reuse", [(_BASE_CONNECTOR, "_get", Hook(found, pooled))])
        p.group("the send and wait phases", [(_REQUEST, "send", Hook(send_begins, self._sent))])
        p.group("body chunk times", [(_READER, "feed_data", Tap(body_chunk, argument="data"))])
        self._emitter.on_forget.append(forget_streams)

    def uninstall(self) -> None:
        """Undo every hook. The emitter ends the attempts still in flight."""
        self._patches.restore()
        streams.clear()
        if forget_streams in self._emitter.on_forget:
            self._emitter.on_forget.remove(forget_streams)

    # -- the call and the attempt -------------------------------------------------------------

    def _end_before_headers(self, call: SessionRequest, error: BaseException | None = None) -> None:
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
        attempt = streams.pop(id(stream), None)
        if attempt is None:
            return
        if error is None:
            self._emitter.finish(attempt)
        else:
            self._emitter.finish_failed(attempt, error)

    def _request_returns(self, state: tuple[SessionRequest, Any], result: Any) -> Any:
        call, token = state
        session_request.reset(token)
        # Never handed to its response (a fault in between): nothing else will end it.
        self._end_before_headers(call)
        return result

    def _request_fails(self, state: tuple[SessionRequest, Any], exc: BaseException) -> None:
        call, token = state
        reset(token)
        self._end_before_headers(call, exc)

    def _attempt_begins(self, conn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call = session_request.get()
        if call is None:
            return SKIP
        # An attempt still owned here: aiohttp retried on its own after it failed (a dropped
        # pooled connection); the failure was swallowed, the attempt still ends here.
        self._end_before_headers(call)
        req = arg(args, kwargs, 0, "req")
        url = req.url
        attempt = Timeline(req.method, str(url))
        attempt.client = "aiohttp"
        attempt.resend_count = call.attempts + request_resend_count(req.headers)
        if req.proxy is not None:
            attempt.proxy_url = str(req.proxy)
        if conn.force_close:
            attempt.closed_by = "force_close=True"
        elif asks_to_close(req.headers):
            attempt.closed_by = CONNECTION_CLOSE
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

    def _abandon(self, state: tuple[SessionRequest, Timeline, Any]) -> None:
        self._end_before_headers(state[0])

    # -- request and response -----------------------------------------------------------------

    def _sent(self, state: tuple[Timeline, Any], response: Any) -> Any:
        attempt, req = state
        writer = req._writer
        if writer is None:
            request_sent(attempt)
        else:
            writer.add_done_callback(partial(self._body_written, attempt))
        return response

    def _body_written(self, attempt: Timeline, _task: Any) -> None:
        try:
            request_sent(attempt)
        except Exception:
            self._emitter.failed_once("aiohttp request body")

    def _headers_in(self, state: tuple[SessionRequest, Timeline, Any], result: Any) -> Any:
        call, attempt, response = state
        call.attempt = None
        content = response.content
        # From here on the body stream owns the attempt (before anything here can fail: the
        # response's release or close then still ends it).
        streams[id(content)] = attempt
        headers_received(attempt, response)
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
        if payload is None or id(payload) not in streams:
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
            pools.watch(connector, read_connector)
        return result

    def _proxy_connected(self, state: tuple[SessionRequest, Any, Any], result: Any) -> Any:
        call, connector, req = state
        call.tunnel = False
        # The connection the request runs on (through a tunnel, a new protocol over the
        # proxy's socket, which never hears of the close), counted under the target like a
        # direct one.
        pools = self._emitter.pools
        pools.lifetimes.opened(result[1], req.host, req.port)
        pools.watch(connector, read_connector)
        return result

    def _body_fails(self, stream: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._end_body(stream, arg(args, kwargs, 0, "exc"))
