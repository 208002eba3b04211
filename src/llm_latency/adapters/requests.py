"""The requests adapter, on urllib3 underneath (so plain urllib3 users are covered too).

How each phase is observed (hooks on urllib3's classes; each group degrades on its own, see
``_patching``):

- an *attempt* is one call of ``HTTPConnectionPool.urlopen``; urllib3 calls it again for each
  of its own retries (``Retry`` on requests' ``HTTPAdapter``) and redirects, and each call gets
  ``http.request.resend_count`` = the length of the ``Retry`` history. The request span starts
  there and ``traceparent`` is added to the request headers;
- ``queue``: ``HTTPConnectionPool._get_conn`` when the pool blocks (``pool_block=True``) and
  every connection is in use;
- ``connect``: ``HTTPConnection._new_conn`` (``dns``: the ``socket.getaddrinfo`` call inside it,
  see ``_resolver``); ``tls``: ``_ssl_wrap_socket_and_match_hostname``;
- ``send``: ``HTTPConnection.request`` (headers and body written);
- ``wait``: from there until the response headers are parsed (``HTTPResponse`` is built);
- ``receive``: from the headers until the body's end is read (urllib3 releases the connection),
  the response is closed (by the program, or when it is garbage-collected, also inside a
  reference cycle: see ``_EndsWhenCollected``) or drained, or reading fails. Like httpcore,
  urllib3 reads the socket when the program reads the body, so chunk times are the times the
  program received them.

The connection pool (``pools``): a pool is read when the SDK collects, from the first connection
object it makes (``_new_conn``); a connection opens at the end of ``HTTPConnection.connect``
and closes at ``close``.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import weakref
from collections.abc import Iterator
from contextvars import ContextVar
from functools import partial
from types import CodeType, FrameType
from typing import Any, Final

import urllib3

from llm_latency.adapters._patching import (
    SKIP,
    Hook,
    PatchSet,
    Rewrite,
    Tap,
    Unavailable,
    phase_hook,
)
from llm_latency.adapters._resolver import connecting, resolver_hooks
from llm_latency.calls import LogicalCall, current_call
from llm_latency.clock import clock_ns
from llm_latency.emitter import Emitter
from llm_latency.headers import request_resend_count
from llm_latency.pools import ConnectionLifetimes, PoolMetrics, PoolRow
from llm_latency.streams import counter_for
from llm_latency.suppression import tracing_allowed
from llm_latency.timeline import CONNECT, QUEUE, RECEIVE, SEND, TLS, WAIT, Timeline

_ATTEMPT: Final = "_llm_latency_attempt"
_CATCHING: Final = "_llm_latency_catching"
_RELEASED: Final = "_llm_latency_released"
#: An object only the response holds: it ends the attempt when the response is collected.
_COLLECTED: Final = "_llm_latency_collected"

_POOL: Final = "urllib3.connectionpool:HTTPConnectionPool"
_HTTPS_POOL: Final = "urllib3.connectionpool:HTTPSConnectionPool"
_CONNECTION: Final = "urllib3.connection:HTTPConnection"
_HTTPS_CONNECTION: Final = "urllib3.connection:HTTPSConnection"
#: The connections a pool made (a weak set on the pool), to tell its checked-out ones.
_CONNECTIONS: Final = "_llm_latency_connections"
_RESPONSE: Final = "urllib3.response:HTTPResponse"
_TLS_MODULE: Final = "urllib3.connection"
#: Where body bytes come from: plain and length-delimited reads, and chunked ones.
_CHUNK_SOURCES: Final = ("_raw_read", "_handle_chunk")

# The attempt of the urlopen call running in this thread (urllib3 is synchronous).
_current: ContextVar[Timeline | None] = ContextVar("llm_latency_urllib3", default=None)

# urlopen(method, url, body=None, headers=None, retries=None, ...): positions of the arguments
_HEADERS_AT: Final = 3
_RETRIES_AT: Final = 4


def _resend_count(retries: Any, headers: Any) -> int:
    """urllib3's own retries so far, else what a retry-count header says (botocore retries
    in its own loop, one ``urlopen`` per attempt)."""
    history = getattr(retries, "history", None)
    return len(history) if history else request_resend_count(headers)


def _full_url(pool: Any, url: str) -> str:
    if "://" in url:  # a proxy request carries the absolute URL
        return url
    host = pool.host
    netloc = f"[{host}]" if ":" in host else host
    if pool.port is not None:
        netloc = f"{netloc}:{pool.port}"
    return f"{pool.scheme}://{netloc}{url}"


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], at: int, name: str) -> Any:
    return args[at] if len(args) > at else kwargs.get(name)


class _Urlopen:
    """What one traced ``urlopen`` call set up, to be undone when it returns or raises."""

    __slots__ = ("attempt", "call", "call_token", "token")

    def __init__(
        self, attempt: Timeline, token: Any, call: LogicalCall | None, call_token: Any
    ) -> None:
        self.attempt = attempt
        self.token = token
        self.call = call
        self.call_token = call_token


class RequestsAdapter:
    """Hooks urllib3 to fill a Timeline per attempt."""

    name = "requests"

    def __init__(self, emitter: Emitter) -> None:
        self._emitter = emitter
        self._patches = PatchSet("requests", emitter.failed_once)
        self._resolver_acquired = False
        self._framing_code: CodeType | None = None
        self.lost: list[str] = self._patches.lost

    def install(self) -> None:
        """Hook urllib3's pool, connection and response classes. Raises :class:`Unavailable`
        when the request span itself cannot be observed."""
        p = self._patches
        ends = Hook(self._ends)
        urlopen = Hook(self._urlopen_begins, self._urlopen_returns, self._urlopen_fails)
        if not p.group(
            "request spans",
            [
                (_POOL, "urlopen", urlopen),
                (_POOL, "_make_request", Hook(_connection_taken, error=self._request_fails)),
                (_RESPONSE, "__init__", Hook(_response_begins, self._response_built)),
                (_RESPONSE, "_error_catcher", Hook(_response_attempt, self._catching)),
                (_RESPONSE, "release_conn", Hook(self._released)),
                (_RESPONSE, "close", ends),
                (_RESPONSE, "drain_conn", Hook(_response_attempt, self._drained)),
            ],
        ):
            raise Unavailable(p.lost)
        self._framing_code = _code_of(_RESPONSE, "_update_chunk_length")
        if self._framing_code is None:
            self.lost.append(
                "the error of a broken chunked body "
                "(urllib3.response.HTTPResponse._update_chunk_length not found)"
            )
        p.group("the queue phase", [(_POOL, "_get_conn", phase_hook(QUEUE, _queued, resume=True))])
        p.group(
            "the connect phase",
            [(_CONNECTION, "_new_conn", Hook(_connect_begins, _connect_ends, _connect_fails))],
        )
        p.group(
            "the tls phase",
            [
                (
                    "urllib3.connection",
                    "_ssl_wrap_socket_and_match_hostname",
                    phase_hook(TLS, _handshaking),
                )
            ],
        )
        p.group("the send and wait phases", [(_CONNECTION, "request", Hook(_send_begins, _sent))])
        pools = self._emitter.pools
        made = Hook(_itself, partial(_connection_made, pools))
        opened = Hook(_itself, partial(_connection_opened, pools.lifetimes))
        p.group(
            "the connection pool",
            [
                (_POOL, "_new_conn", made),
                (_HTTPS_POOL, "_new_conn", made),
                (_CONNECTION, "connect", opened),
                (_HTTPS_CONNECTION, "connect", opened),
                (_CONNECTION, "close", Hook(pools.lifetimes.on_close)),
            ],
        )
        chunk = Tap(_chunk_read)
        p.group(
            "body chunk times",
            [(_RESPONSE, "_raw_read", chunk), (_RESPONSE, "_handle_chunk", chunk)],
        )
        self.lost.extend(resolver_hooks.acquire(self._emitter.failed_once))
        self._resolver_acquired = True

    def uninstall(self) -> None:
        """Undo every hook."""
        self._patches.restore()
        if self._resolver_acquired:
            self._resolver_acquired = False
            resolver_hooks.release()

    # -- the attempt --------------------------------------------------------------------------

    def _urlopen_begins(self, pool: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not tracing_allowed():
            return SKIP
        method = _argument(args, kwargs, 0, "method")
        url = _argument(args, kwargs, 1, "url")
        headers = _argument(args, kwargs, _HEADERS_AT, "headers")
        rewrite = headers is None
        if rewrite:  # urllib3 would send the pool's headers: a copy of them, to add traceparent
            headers = dict(pool.headers)
            if len(args) > _HEADERS_AT:
                args = (*args[:_HEADERS_AT], headers, *args[_HEADERS_AT + 1 :])
            else:
                kwargs = {**kwargs, "headers": headers}
        attempt = Timeline(method, _full_url(pool, url))
        attempt.resend_count = _resend_count(
            _argument(args, kwargs, _RETRIES_AT, "retries"), headers
        )
        path = url.partition("?")[0] if "://" not in url else urllib3.util.parse_url(url).path
        # The outermost urlopen groups urllib3's own retries and redirects (it recurses for
        # each), so the waits between them become retry.backoff spans.
        call = LogicalCall() if current_call.get() is None else None
        call_token = None if call is None else current_call.set(call)
        try:
            carrier: dict[str, str] = {}
            self._emitter.start(attempt, pool.host, pool.port, path or "/", carrier)
            headers.update(carrier)
        except BaseException:
            self._emitter.finish(attempt)
            if call_token is not None:
                current_call.reset(call_token)
            raise
        state = _Urlopen(attempt, _current.set(attempt), call, call_token)
        return Rewrite(state, args, kwargs) if rewrite else state

    def _urlopen_done(self, state: _Urlopen) -> None:
        _current.reset(state.token)
        if state.call_token is not None:
            current_call.reset(state.call_token)
            if state.call is not None:
                self._emitter.calls.close_call(state.call)

    def _urlopen_returns(self, state: _Urlopen, response: Any) -> Any:
        try:
            attempt = state.attempt
            if not attempt.ended and getattr(response, "__dict__", {}).get(_ATTEMPT) is not attempt:
                # Nothing will end it (a fault kept it from its response): it ends here.
                self._emitter.finish(attempt)
        finally:
            self._urlopen_done(state)
        return response

    def _urlopen_fails(self, state: _Urlopen, exc: BaseException) -> None:
        try:
            self._emitter.finish_failed(state.attempt, exc)
        finally:
            self._urlopen_done(state)

    def _request_fails(self, attempt: Timeline, exc: BaseException) -> None:
        # urllib3 may retry after this: the attempt ends here, with its own error.
        self._emitter.finish_failed(attempt, exc)

    # -- the response -------------------------------------------------------------------------

    def _response_built(self, state: tuple[Timeline, Any], result: None) -> None:
        attempt, resp = state
        _headers_received(attempt, resp)
        if resp._body is not None or resp.length_remaining == 0 or resp.closed:
            self._emitter.finish(attempt)  # the body was read at once (preload_content)
        else:
            resp.__dict__[_COLLECTED] = _EndsWhenCollected(attempt, self._emitter)

    def _catching(self, state: tuple[Timeline, Any], catcher: Any) -> Any:
        return _ErrorCatcher(catcher, state[0], state[1], self._emitter)

    def _released(self, resp: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The connection goes back to the pool. Inside a read (``_error_catcher``) the end is
        left to that read: it knows whether the body ended or failed (urllib3 releases the
        connection before raising)."""
        state = resp.__dict__
        attempt: Timeline | None = state.get(_ATTEMPT)
        if attempt is not None and not attempt.ended:
            if state.get(_CATCHING):
                state[_RELEASED] = True
            else:
                self._emitter.finish(attempt)

    def _ends(self, resp: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The response is closed: by the program (even mid-stream, while a chunked read is
        suspended in its generator), or when it is garbage-collected. urllib3 itself closes it
        on broken chunk framing, right before raising: that end is left to the read."""
        state = resp.__dict__
        attempt: Timeline | None = state.get(_ATTEMPT)
        if attempt is not None and not attempt.ended:
            if _called_from(self._framing_code):
                state[_RELEASED] = True
            else:
                self._emitter.finish(attempt)

    def _drained(self, attempt: Timeline, result: Any) -> Any:
        self._emitter.finish(attempt)
        return result


class _EndsWhenCollected:
    """Held by a streamed response only: collected with it, it ends the attempt if nothing
    else did.

    IOBase's finalizer closes a collected response, and ``close`` ends the attempt, but only
    when the response is freed on its own. In a reference cycle (Locust's response and its
    ``request_meta`` hold each other), the garbage collector finalizes the cycle's objects in
    any order: when the ``http.client`` response inside goes first, the urllib3 response
    already reads as closed, its finalizer does not call ``close``, and without this the span
    would never end.
    """

    __slots__ = ("_attempt", "_emitter")

    def __init__(self, attempt: Timeline, emitter: Emitter) -> None:
        self._attempt = attempt
        self._emitter = emitter

    def __del__(self) -> None:
        if not self._attempt.ended:
            self._emitter.finish(self._attempt)


class _ErrorCatcher:
    """urllib3's ``_error_catcher`` context, telling the attempt how the read inside ended."""

    __slots__ = ("_attempt", "_emitter", "_inner", "_resp")

    def __init__(self, inner: Any, attempt: Timeline, resp: Any, emitter: Emitter) -> None:
        self._inner = inner
        self._attempt = attempt
        self._resp = resp
        self._emitter = emitter

    def __enter__(self) -> Any:
        self._resp.__dict__[_CATCHING] = True
        return self._inner.__enter__()

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> Any:
        try:
            suppressed = self._inner.__exit__(kind, error, traceback)
        except BaseException as raised:  # urllib3 raised its own exception in place of error
            self._read_ends(raised)
            raise
        self._read_ends(None if suppressed else error)
        return suppressed

    def _read_ends(self, error: BaseException | None) -> None:
        try:
            state = self._resp.__dict__
            state[_CATCHING] = False
            released = state.pop(_RELEASED, False)
            attempt = self._attempt
            if attempt.ended:
                return
            if error is not None and not isinstance(error, GeneratorExit):
                self._emitter.finish_failed(attempt, error)
            elif released:
                self._emitter.finish(attempt)
        except Exception:
            self._emitter.failed_once("urllib3 response read")


def _headers_received(attempt: Timeline, resp: Any) -> None:
    attempt.status_code = resp.status
    version = resp.version
    if version in (10, 11, 20):
        attempt.protocol_version = {10: "1.0", 11: "1.1", 20: "2"}[version]
    headers = resp.headers
    attempt.response_headers = list(headers.items())
    attempt.stream = counter_for(headers.get("content-type"))


# -- hooks that need no emitter ------------------------------------------------------------------


def _live_attempt() -> Timeline | None:
    attempt = _current.get()
    return None if attempt is None or attempt.ended else attempt


def _connection_taken(pool: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    attempt = _current.get()
    if attempt is None:
        return SKIP
    conn = args[0] if args else kwargs["conn"]
    attempt.reused = getattr(conn, "sock", None) is not None
    return attempt


def _response_begins(resp: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    attempt = _live_attempt()
    if attempt is None or attempt.current_phase == RECEIVE:
        return SKIP
    resp.__dict__[_ATTEMPT] = attempt  # first: from here on, the response's end ends it
    attempt.advance(RECEIVE)
    return attempt, resp  # __init__ then reads the whole body if preload_content


def _response_attempt(resp: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    attempt: Timeline | None = resp.__dict__.get(_ATTEMPT)
    return SKIP if attempt is None or attempt.ended else (attempt, resp)


def _code_of(owner: str, name: str) -> CodeType | None:
    """The code object of a function, to recognise it on the stack; None if it is missing."""
    module_name, _, class_name = owner.partition(":")
    try:
        function = inspect.getattr_static(
            getattr(importlib.import_module(module_name), class_name), name
        )
    except (ImportError, AttributeError):
        return None
    code = getattr(inspect.unwrap(function), "__code__", None)
    return code if isinstance(code, CodeType) else None


def _called_from(code: CodeType | None, depth: int = 8) -> bool:
    """Whether ``code`` runs in one of the few frames below this call (checked only when a
    response is closed, so reads pay nothing for it)."""
    if code is None:
        return False
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and depth:
        if frame.f_code is code:
            return True
        frame, depth = frame.f_back, depth - 1
    return False


def _chunk_read(resp: Any, data: bytes) -> None:
    if data:
        attempt: Timeline | None = resp.__dict__.get(_ATTEMPT)
        if attempt is not None and not attempt.ended:
            attempt.chunk(data)


def _queued(pool: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Timeline | None:
    """The attempt about to wait for a connection: the pool blocks and has none free."""
    attempt = _current.get()
    if attempt is None or not pool.block or pool.pool is None or not pool.pool.empty():
        return None
    return attempt


# -- the connection pool ---------------------------------------------------------------------


def _itself(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return instance


def _connection_made(pools: PoolMetrics, pool: Any, connection: Any) -> Any:
    """``pool`` made a connection object (it connects when first used). Not one made where
    instrumentation is suppressed (an OTLP exporter's own): it is not the program's."""
    if not tracing_allowed():
        return connection
    members = pool.__dict__.get(_CONNECTIONS)
    if members is None:
        members = pool.__dict__.setdefault(_CONNECTIONS, weakref.WeakSet())
        pools.watch(pool, _read_pool)
    members.add(connection)
    return connection


def _connection_opened(lifetimes: ConnectionLifetimes, connection: Any, result: Any) -> Any:
    if tracing_allowed():
        lifetimes.opened(connection, connection.host, connection.port)
    return result


def _read_pool(pool: Any, lifetimes: ConnectionLifetimes) -> Iterator[PoolRow]:
    """One pool (one host): its idle connections wait in its queue; the open ones it made that
    are not there are checked out, so active. Its ``maxsize`` limits the connections only when
    it blocks (``pool_block=True``); otherwise more are opened, and closed after use."""
    queue = pool.pool
    members = pool.__dict__.get(_CONNECTIONS)
    if queue is None or members is None:  # closed, or never connected
        return
    waiting = {id(connection) for connection in list(queue.queue) if connection is not None}
    active = idle = 0
    for connection in list(members):
        if lifetimes.is_open(connection):
            if id(connection) in waiting:
                idle += 1
            else:
                active += 1
    if active or idle:
        yield (pool.host, pool.port), active, idle, queue.maxsize if pool.block else None


def _connect_begins(conn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    attempt = _live_attempt()
    if attempt is None:
        return SKIP
    # Plain HTTP connects lazily, inside send: that send had not started, it starts again
    # once connected (a refused connect has no send phase).
    sending = attempt.current_phase == SEND
    if sending:
        attempt.discard(SEND)
    attempt.reused = False
    attempt.begin(CONNECT)
    return attempt, connecting.set(attempt), sending


def _connect_ends(state: tuple[Timeline, Any, bool], sock: Any) -> Any:
    attempt, token, sending = state
    connecting.reset(token)
    now = clock_ns()
    if attempt.current_phase == CONNECT:
        attempt.end_phase(CONNECT, now)
    if sending:
        attempt.begin(SEND, now)
    return sock


def _connect_fails(state: tuple[Timeline, Any, bool], exc: BaseException) -> None:
    connecting.reset(state[1])


def _handshaking(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _live_attempt()


def _send_begins(conn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    attempt = _live_attempt()
    if attempt is None:
        return SKIP
    attempt.begin(SEND)
    return attempt


def _sent(attempt: Timeline, result: Any) -> Any:
    attempt.advance(WAIT)
    return result
