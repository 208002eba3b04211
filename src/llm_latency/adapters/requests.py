"""The requests adapter, on urllib3 underneath (so plain urllib3 users are covered too).

How each phase is observed (patches on urllib3's classes):

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
  the response is closed or drained, or reading fails. Like httpcore, urllib3 reads the socket
  when the program reads the body, so chunk times are the times the program received them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, Final

import urllib3
from urllib3 import connection, connectionpool, response

from llm_latency.adapters._patching import Patches
from llm_latency.adapters._resolver import connecting, resolver_hooks
from llm_latency.calls import LogicalCall, current_call
from llm_latency.emitter import Emitter
from llm_latency.sse import SSECounter
from llm_latency.suppression import tracing_allowed
from llm_latency.timeline import CONNECT, QUEUE, RECEIVE, SEND, TLS, WAIT, Timeline, _now

_ATTEMPT: Final = "_llm_latency_attempt"
_CATCHING: Final = "_llm_latency_catching"
_RELEASED: Final = "_llm_latency_released"

# The attempt of the urlopen call running in this thread (urllib3 is synchronous).
_current: ContextVar[Timeline | None] = ContextVar("llm_latency_urllib3", default=None)


def _resend_count(retries: Any) -> int:
    history = getattr(retries, "history", None)
    return len(history) if history else 0


def _full_url(pool: Any, url: str) -> str:
    if "://" in url:  # a proxy request carries the absolute URL
        return url
    host = pool.host
    netloc = f"[{host}]" if ":" in host else host
    if pool.port is not None:
        netloc = f"{netloc}:{pool.port}"
    return f"{pool.scheme}://{netloc}{url}"


class RequestsAdapter:
    """Patches urllib3 to fill a Timeline per attempt."""

    name = "requests"

    def __init__(self, emitter: Emitter) -> None:
        self._emitter = emitter
        self._patches = Patches()
        self._resolver_acquired = False

    def install(self) -> None:
        """Patch urllib3's pool, connection and response classes."""
        p = self._patches
        pool = connectionpool.HTTPConnectionPool
        p.replace(pool, "urlopen", self._wrap_urlopen(pool.urlopen))
        p.replace(pool, "_get_conn", _wrap_get_conn(pool._get_conn))
        p.replace(pool, "_make_request", self._wrap_make_request(pool._make_request))
        conn = connection.HTTPConnection
        p.replace(conn, "_new_conn", _wrap_new_conn(conn._new_conn))
        p.replace(conn, "request", _wrap_send(conn.request))
        p.replace(
            connection,
            "_ssl_wrap_socket_and_match_hostname",
            _wrap_tls(connection._ssl_wrap_socket_and_match_hostname),
        )
        resp = response.HTTPResponse
        p.replace(resp, "__init__", self._wrap_response_init(resp.__init__))
        p.replace(resp, "_raw_read", _wrap_chunk_source(resp._raw_read))
        p.replace(resp, "_handle_chunk", _wrap_chunk_source(resp._handle_chunk))
        p.replace(resp, "_error_catcher", self._wrap_error_catcher(resp._error_catcher))
        p.replace(resp, "release_conn", self._wrap_release(resp.release_conn))
        p.replace(resp, "close", self._wrap_release(resp.close))
        p.replace(resp, "drain_conn", self._wrap_release(resp.drain_conn, after=True))
        resolver_hooks.acquire()
        self._resolver_acquired = True

    def uninstall(self) -> None:
        """Undo every patch."""
        self._patches.restore()
        if self._resolver_acquired:
            self._resolver_acquired = False
            resolver_hooks.release()

    # -- the attempt --------------------------------------------------------------------------

    def _begin(self, pool: Any, method: str, url: str, headers: Any, retries: Any) -> Timeline:
        attempt = Timeline(method, _full_url(pool, url))
        attempt.resend_count = _resend_count(retries)
        carrier: dict[str, str] = {}
        path = url.partition("?")[0] if "://" not in url else urllib3.util.parse_url(url).path
        self._emitter.start(attempt, pool.host, pool.port, path or "/", carrier)
        if headers is not None and carrier:
            headers.update(carrier)
        return attempt

    def _wrap_urlopen(self, original: Callable[..., Any]) -> Callable[..., Any]:
        emitter = self._emitter
        begin = self._begin

        def urlopen(
            pool: Any,
            method: str,
            url: str,
            body: Any = None,
            headers: Any = None,
            retries: Any = None,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            if not tracing_allowed():
                return original(pool, method, url, body, headers, retries, *args, **kwargs)
            if headers is None:
                headers = dict(pool.headers)
            # The outermost urlopen groups urllib3's own retries and redirects (it recurses
            # for each), so the waits between them become retry.backoff spans.
            call_token = None
            if current_call.get() is None:
                call = LogicalCall()
                call_token = current_call.set(call)
            try:
                attempt = begin(pool, method, url, headers, retries)
            except Exception:
                emitter.failed_once("urllib3 urlopen")
                if call_token is not None:
                    current_call.reset(call_token)
                return original(pool, method, url, body, headers, retries, *args, **kwargs)
            token = _current.set(attempt)
            try:
                return original(pool, method, url, body, headers, retries, *args, **kwargs)
            except BaseException as exc:
                if not attempt.ended:
                    attempt.fail(exc)
                    emitter.finish(attempt)
                raise
            finally:
                _current.reset(token)
                if call_token is not None:
                    current_call.reset(call_token)
                    emitter.close_call(call)

        return urlopen

    def _wrap_make_request(self, original: Callable[..., Any]) -> Callable[..., Any]:
        emitter = self._emitter

        def _make_request(pool: Any, conn: Any, *args: Any, **kwargs: Any) -> Any:
            attempt = _current.get()
            if attempt is None:
                return original(pool, conn, *args, **kwargs)
            attempt.reused = getattr(conn, "sock", None) is not None
            try:
                return original(pool, conn, *args, **kwargs)
            except BaseException as exc:
                # urllib3 may retry after this: the attempt ends here, with its own error.
                attempt.fail(exc)
                emitter.finish(attempt)
                raise

        return _make_request

    # -- the response -------------------------------------------------------------------------

    def _wrap_response_init(self, original: Callable[..., None]) -> Callable[..., None]:
        emitter = self._emitter

        def __init__(resp: Any, *args: Any, **kwargs: Any) -> None:
            attempt = _current.get()
            if attempt is None or attempt.ended or attempt.current_phase not in (SEND, WAIT):
                original(resp, *args, **kwargs)
                return
            now = _now()
            attempt.finish(attempt.current_phase, now)
            attempt.begin(RECEIVE, now)
            resp.__dict__[_ATTEMPT] = attempt
            original(resp, *args, **kwargs)  # reads the whole body now if preload_content
            try:
                _headers_received(attempt, resp)
            except Exception:
                emitter.failed_once("urllib3 response")
            if resp._body is not None or resp.length_remaining == 0 or resp.closed:
                emitter.finish(attempt)

        return __init__

    def _wrap_error_catcher(
        self, original: Callable[..., contextlib.AbstractContextManager[None]]
    ) -> Callable[..., contextlib.AbstractContextManager[None]]:
        emitter = self._emitter

        @contextlib.contextmanager
        def _error_catcher(resp: Any) -> Iterator[None]:
            attempt: Timeline | None = resp.__dict__.get(_ATTEMPT)
            if attempt is None or attempt.ended:
                with original(resp):
                    yield
                return
            state = resp.__dict__
            state[_CATCHING] = True
            try:
                with original(resp):
                    yield
            except BaseException as exc:
                state[_CATCHING] = False
                if not attempt.ended and not isinstance(exc, GeneratorExit):
                    attempt.fail(exc)
                    emitter.finish(attempt)
                raise
            state[_CATCHING] = False
            if state.pop(_RELEASED, False):
                emitter.finish(attempt)

        return _error_catcher

    def _wrap_release(
        self, original: Callable[..., Any], after: bool = False
    ) -> Callable[..., Any]:
        """End the attempt when the response is released, closed or drained. Inside a read
        (``_error_catcher``) the end is left to that read: it knows whether the body ended or
        failed (urllib3 closes the response before raising)."""
        emitter = self._emitter

        def end(resp: Any, *args: Any, **kwargs: Any) -> Any:
            state = resp.__dict__
            attempt: Timeline | None = state.get(_ATTEMPT)
            if not after and attempt is not None and not attempt.ended:
                if state.get(_CATCHING):
                    state[_RELEASED] = True
                else:
                    emitter.finish(attempt)
            result = original(resp, *args, **kwargs)
            if after and attempt is not None and not attempt.ended:
                emitter.finish(attempt)
            return result

        return end


def _headers_received(attempt: Timeline, resp: Any) -> None:
    attempt.status_code = resp.status
    version = resp.version
    if version in (10, 11, 20):
        attempt.protocol_version = {10: "1.0", 11: "1.1", 20: "2"}[version]
    headers = resp.headers
    attempt.response_headers = list(headers.items())
    if headers.get("content-type", "").startswith("text/event-stream"):
        attempt.sse = SSECounter()


def _wrap_chunk_source(original: Callable[..., bytes]) -> Callable[..., bytes]:
    def read(resp: Any, *args: Any, **kwargs: Any) -> bytes:
        data = original(resp, *args, **kwargs)
        if data:
            attempt: Timeline | None = resp.__dict__.get(_ATTEMPT)
            if attempt is not None and not attempt.ended:
                attempt.chunk(data)
        return data

    return read


# -- connection phases ---------------------------------------------------------------------------


def _wrap_get_conn(original: Callable[..., Any]) -> Callable[..., Any]:
    def _get_conn(pool: Any, *args: Any, **kwargs: Any) -> Any:
        attempt = _current.get()
        if attempt is None or not pool.block or pool.pool is None or not pool.pool.empty():
            return original(pool, *args, **kwargs)
        attempt.resume(QUEUE)
        conn = original(pool, *args, **kwargs)
        attempt.finish(QUEUE)
        return conn

    return _get_conn


def _wrap_new_conn(original: Callable[..., Any]) -> Callable[..., Any]:
    def _new_conn(conn: Any) -> Any:
        attempt = _current.get()
        if attempt is None or attempt.ended:
            return original(conn)
        sending = attempt.current_phase == SEND  # plain HTTP connects lazily, inside send
        attempt.reused = False
        attempt.begin(CONNECT)
        token = connecting.set(attempt)
        try:
            sock = original(conn)
        finally:
            connecting.reset(token)
        now = _now()
        attempt.finish(CONNECT, now)
        if sending:
            attempt.begin(SEND, now)
        return sock

    return _new_conn


def _wrap_tls(original: Callable[..., Any]) -> Callable[..., Any]:
    def wrap_socket(*args: Any, **kwargs: Any) -> Any:
        attempt = _current.get()
        if attempt is None or attempt.ended:
            return original(*args, **kwargs)
        attempt.begin(TLS)
        result = original(*args, **kwargs)
        attempt.finish(TLS)
        return result

    return wrap_socket


def _wrap_send(original: Callable[..., Any]) -> Callable[..., Any]:
    def request(conn: Any, *args: Any, **kwargs: Any) -> Any:
        attempt = _current.get()
        if attempt is None or attempt.ended:
            return original(conn, *args, **kwargs)
        attempt.begin(SEND)
        result = original(conn, *args, **kwargs)
        now = _now()
        attempt.finish(SEND, now)
        attempt.begin(WAIT, now)
        return result

    return request
