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
- through a proxy (requests' ``proxies``, urllib3's ``ProxyManager``), ``dns`` and ``connect``
  are the proxy's; in a ``CONNECT`` tunnel, ``proxy`` is ``HTTPConnection._tunnel`` (the
  tunnel's request and the proxy's answer); the attempt's host is the target's, also when a
  plain HTTP request goes to the proxy's pool in absolute form;
- ``send``: ``HTTPConnection.request`` (headers and body written);
- ``wait``: from there until the response headers are parsed (``HTTPResponse`` is built);
- ``receive``: from the headers until the attempt ends (below). Like httpcore, urllib3 reads
  the socket when the program reads the body, so chunk times are the times the program
  received them.

The attempt of each ``urlopen`` call and the ways it ends: ``_urllib3_attempt``.

The connection pools (``pools``): ``_urllib3_pool``.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from functools import partial
from typing import Any, Final

import urllib3

from llm_latency.adapters._hooks import SKIP, Hook, Rewrite, Tap, phase_hook
from llm_latency.adapters._patching import PatchSet, Unavailable
from llm_latency.adapters._resolver import connecting, resolver_hooks, socket_peer
from llm_latency.adapters._urllib3_attempt import (
    ATTEMPT,
    Attempt,
    ErrorCatcher,
    argument,
    body_ended,
    chunk_read,
    closing,
    code_of,
    current,
    ended,
    live_timeline,
    response_attempt,
    response_begins,
    response_built,
)
from llm_latency.adapters._urllib3_pool import CONNECTION, POOL, pool_hooks
from llm_latency.calls import LogicalCall, current_call
from llm_latency.clock import clock_ns
from llm_latency.emitter import Emitter
from llm_latency.headers import CONNECTION_CLOSE, asks_to_close, request_resend_count
from llm_latency.suppression import tracing_allowed
from llm_latency.timeline import CONNECT, PROXY, QUEUE, SEND, TLS, WAIT, Timeline

_RESPONSE: Final = "urllib3.response:HTTPResponse"

# urlopen(method, url, body=None, headers=None, retries=None, ...): positions of the arguments
_HEADERS_AT: Final = 3
_RETRIES_AT: Final = 4
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


def _with(headers: Any, carrier: dict[str, str]) -> Any:
    """A copy of ``headers`` (of its own type when it can copy itself: an ``HTTPHeaderDict``
    keeps its repeated fields) with ``carrier``'s fields added."""
    structures = sys.modules.get("requests.structures")  # imported if the program uses requests
    kind = type(headers)
    if structures is not None and kind is structures.CaseInsensitiveDict:
        store = headers.__dict__.get("_store")
        if type(store) is OrderedDict:
            # requests' PreparedRequest.headers, the commonest case: its store copied in C,
            # where its own copy() sets each field again in Python (about 1.8 us a request).
            store = store.copy()
            for name, value in carrier.items():
                store[name.lower()] = (name, value)
            sent = kind.__new__(kind)
            sent._store = store
            return sent
    copy = getattr(headers, "copy", None)
    sent = copy() if callable(copy) else dict(headers)
    sent.update(carrier)
    return sent


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


class _Urlopen:
    """What one traced ``urlopen`` call set up, to be undone when it returns or raises."""

    __slots__ = ("attempt", "call", "call_token", "token")

    def __init__(self, attempt: Attempt, token: Any, call: LogicalCall | None, call_token: Any):
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
        self.lost: list[str] = self._patches.lost

    def install(self) -> None:
        """Hook urllib3's pool, connection and response classes. Raises :class:`Unavailable`
        when the request span itself cannot be observed."""
        p = self._patches
        urlopen = Hook(self._urlopen_begins, self._urlopen_returns, self._urlopen_fails)
        framing = code_of(_RESPONSE, "_update_chunk_length")
        if not p.group(
            "request spans",
            [
                (POOL, "urlopen", urlopen),
                (POOL, "_make_request", Hook(_connection_taken, error=Attempt.end)),
                (_RESPONSE, "__init__", Hook(response_begins, response_built)),
                (_RESPONSE, "_error_catcher", Hook(response_attempt, ErrorCatcher)),
                (_RESPONSE, "release_conn", Hook(response_attempt, body_ended)),
                (_RESPONSE, "close", Hook(partial(closing, framing))),
                (_RESPONSE, "drain_conn", Hook(response_attempt, ended)),
            ],
        ):
            raise Unavailable(p.lost)
        if framing is None:
            self.lost.append(
                "the error of a broken chunked body "
                "(urllib3.response.HTTPResponse._update_chunk_length not found)"
            )
        p.group("the queue phase", [(POOL, "_get_conn", phase_hook(QUEUE, _queued, resume=True))])
        p.group(
            "the connect phase",
            [(CONNECTION, "_new_conn", Hook(_connect_begins, _connect_ends, _connect_fails))],
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
        p.group("the proxy phase", [(CONNECTION, "_tunnel", phase_hook(PROXY, _handshaking))])
        p.group("the send and wait phases", [(CONNECTION, "request", Hook(_send_begins, _sent))])
        p.group("the connection pool", pool_hooks(self._emitter.pools))
        # _fp_read, inside _raw_read's _error_catcher: a read that ends the body releases the
        # connection (and ends the attempt) before _raw_read returns, so its bytes are seen
        # here first (they hold a JSON answer's usage).
        chunk = Tap(chunk_read)
        p.group(
            "body chunk times",
            [(_RESPONSE, "_fp_read", chunk), (_RESPONSE, "_handle_chunk", chunk)],
        )
        self.lost.extend(resolver_hooks.acquire(self._emitter.failed_once))
        self._resolver_acquired = True

    def uninstall(self) -> None:
        """Undo every hook."""
        self._patches.restore()
        if self._resolver_acquired:
            self._resolver_acquired = False
            resolver_hooks.release()

    # -- the urlopen call ---------------------------------------------------------------------

    def _urlopen_begins(self, pool: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not tracing_allowed():
            return SKIP
        method = argument(args, kwargs, 0, "method")
        url = argument(args, kwargs, 1, "url")
        headers = argument(args, kwargs, _HEADERS_AT, "headers")
        timeline = Timeline(method, _full_url(pool, url))
        timeline.client = "urllib3"
        sent = pool.headers if headers is None else headers
        timeline.resend_count = _resend_count(argument(args, kwargs, _RETRIES_AT, "retries"), sent)
        if asks_to_close(sent):
            timeline.closed_by = CONNECTION_CLOSE
        if pool.proxy is not None:
            timeline.proxy_url = pool.proxy.url
        attempt = Attempt(timeline, self._emitter)
        host, port, path = pool.host, pool.port, url.partition("?")[0]
        if "://" in url:  # in absolute form, to a proxy's pool: the target is in the URL
            target = urllib3.util.parse_url(url)
            host, path = target.host or host, target.path
            port = target.port or _DEFAULT_PORTS.get(target.scheme or "", port)
        # The outermost urlopen groups urllib3's own retries and redirects (it recurses for
        # each), so the waits between them become retry.backoff spans.
        call = LogicalCall() if current_call.get() is None else None
        call_token = None if call is None else current_call.set(call)
        try:
            carrier: dict[str, str] = {}
            self._emitter.start(timeline, host, port, path or "/", carrier)
            rewrite = bool(carrier)
            if rewrite:
                # Into a copy: the mapping urlopen got is the program's (a dict, an
                # HTTPHeaderDict, requests' PreparedRequest.headers) or the pool's defaults,
                # which urllib3 promises never to change.
                headers = _with(pool.headers if headers is None else headers, carrier)
                if len(args) > _HEADERS_AT:
                    args = (*args[:_HEADERS_AT], headers, *args[_HEADERS_AT + 1 :])
                else:
                    kwargs = {**kwargs, "headers": headers}
        except BaseException:
            attempt.end()
            if call_token is not None:
                current_call.reset(call_token)
            raise
        state = _Urlopen(attempt, current.set(attempt), call, call_token)
        return Rewrite(state, args, kwargs) if rewrite else state

    def _urlopen_done(self, state: _Urlopen) -> None:
        current.reset(state.token)
        if state.call_token is not None:
            current_call.reset(state.call_token)
            if state.call is not None:
                self._emitter.calls.close_call(state.call)

    def _urlopen_returns(self, state: _Urlopen, response: Any) -> Any:
        try:
            if getattr(response, "__dict__", {}).get(ATTEMPT) is not state.attempt:
                state.attempt.end()  # nothing else will end it
        finally:
            self._urlopen_done(state)
        return response

    def _urlopen_fails(self, state: _Urlopen, exc: BaseException) -> None:
        try:
            state.attempt.end(exc)
        finally:
            self._urlopen_done(state)


def _connection_taken(pool: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    attempt = current.get()
    if attempt is None:
        return SKIP
    conn = args[0] if args else kwargs["conn"]
    sock = getattr(conn, "sock", None)
    timeline = attempt.timeline
    # A tunnel through a proxy is opened before (``_prepare_proxy``): its connect is this
    # attempt's, the connection is new.
    timeline.reused = sock is not None and timeline.bounds_of(CONNECT) is None
    if sock is not None:
        timeline.peer_address = socket_peer(sock)
    return attempt  # urllib3 may retry after _make_request raises: the attempt ends then


def _queued(pool: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Timeline | None:
    """The attempt about to wait for a connection: the pool blocks and has none free."""
    attempt = current.get()
    if attempt is None or not pool.block or pool.pool is None or not pool.pool.empty():
        return None
    return attempt.timeline


def _connect_begins(conn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    attempt = live_timeline()
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
    attempt.peer_address = socket_peer(sock)
    if sending:
        attempt.begin(SEND, now)
    return sock


def _connect_fails(state: tuple[Timeline, Any, bool], exc: BaseException) -> None:
    connecting.reset(state[1])


def _handshaking(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return live_timeline()


def _send_begins(conn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    attempt = live_timeline()
    if attempt is None:
        return SKIP
    attempt.begin(SEND)
    return attempt


def _sent(attempt: Timeline, result: Any) -> Any:
    attempt.advance(WAIT)
    return result
