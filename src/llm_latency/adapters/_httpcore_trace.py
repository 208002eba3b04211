"""httpcore's ``trace`` extension read into an attempt's Timeline: the events of the connect,
tls, send, wait and receive phases (``connect_tcp.started``, ``start_tls.complete``, ...), and
the ``trace`` callback the httpcore adapter (:mod:`llm_latency.adapters.httpcore`) puts on each
request, chained to one the program set.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llm_latency.adapters._resolver import connecting, peer_address
from llm_latency.emitter import Emitter
from llm_latency.timeline import CONNECT, PROXY, QUEUE, RECEIVE, SEND, TLS, WAIT, Timeline


def _header(headers: list[tuple[bytes, bytes]], wanted: bytes) -> bytes | None:
    """The first value of the response header ``wanted`` (a lowercase name)."""
    for name, value in headers:
        if name.lower() == wanted:
            return value
    return None


def _connect_started(attempt: Timeline, info: dict[str, Any]) -> None:
    attempt.reused = False
    attempt.begin(CONNECT)
    connecting.set(attempt)


def _connect_done(attempt: Timeline, info: dict[str, Any]) -> None:
    connecting.set(None)
    if attempt.current_phase == CONNECT:
        attempt.end_phase(CONNECT)
    note_peer(attempt, info.get("return_value"))


def note_peer(attempt: Timeline, stream: Any) -> None:
    get_extra_info = getattr(stream, "get_extra_info", None)
    if get_extra_info is not None:
        attempt.peer_address = peer_address(get_extra_info("server_addr"))


def _connect_failed(attempt: Timeline, info: dict[str, Any]) -> None:
    connecting.set(None)


def _tls_started(attempt: Timeline, info: dict[str, Any]) -> None:
    if attempt.current_phase == PROXY:
        attempt.advance(TLS)
    else:
        attempt.begin(TLS)


def _tls_done(attempt: Timeline, info: dict[str, Any]) -> None:
    attempt.end_phase(TLS)


def _send_started(attempt: Timeline, info: dict[str, Any]) -> None:
    request = info.get("request")
    if getattr(request, "method", None) == b"CONNECT" and attempt.method != "CONNECT":
        attempt.begin(PROXY)  # a proxy's tunnel opens: its exchange is no phase of the request
        return
    if attempt.reused is None:
        attempt.reused = True
    if attempt.current_phase in (PROXY, QUEUE):  # a tunnel, or a wait for HTTP/2
        attempt.advance(SEND)
    else:
        attempt.begin(SEND)


def _sent(attempt: Timeline, info: dict[str, Any]) -> None:
    if attempt.current_phase != PROXY:
        attempt.advance(WAIT)


def _headers_received(attempt: Timeline, info: dict[str, Any]) -> None:
    if attempt.current_phase == PROXY:
        return  # the proxy's answer to CONNECT
    attempt.advance(RECEIVE)
    result = info.get("return_value")
    if not isinstance(result, tuple):
        return
    if len(result) == 4:  # HTTP/1.1: (http_version, status, reason, headers)
        version, status, _, headers = result
        attempt.protocol_version = version.decode("ascii", "replace").removeprefix("HTTP/")
    else:  # HTTP/2: (status, headers)
        status, headers = result
        attempt.protocol_version = "2"
    attempt.status_code = status
    attempt.response_headers = headers
    encoding = _header(headers, b"content-encoding") if attempt.llm_route else None
    attempt.response_body(_header(headers, b"content-type"), encoding)


_EVENTS: dict[str, Callable[[Timeline, dict[str, Any]], None]] = {
    "connect_tcp.started": _connect_started,
    "connect_tcp.complete": _connect_done,
    "connect_tcp.failed": _connect_failed,
    "connect_unix_socket.started": _connect_started,
    "connect_unix_socket.complete": _connect_done,
    "connect_unix_socket.failed": _connect_failed,
    "start_tls.started": _tls_started,
    "start_tls.complete": _tls_done,
    "send_request_headers.started": _send_started,
    "send_request_body.complete": _sent,
    "receive_response_headers.complete": _headers_received,
}


class SyncTrace:
    """The ``trace`` callback of one attempt; calls the program's own callback after it."""

    __slots__ = ("attempt", "emitter", "inner")

    def __init__(
        self, attempt: Timeline, inner: Callable[..., Any] | None, emitter: Emitter
    ) -> None:
        self.attempt = attempt
        self.inner = inner
        self.emitter = emitter

    def _record(self, name: str, info: dict[str, Any]) -> None:
        attempt = self.attempt
        handler = _EVENTS.get(name.partition(".")[2])
        if handler is not None and not attempt.ended:
            try:
                handler(attempt, info)
            except Exception:
                self.emitter.failed_once("httpcore trace event")

    def __call__(self, name: str, info: dict[str, Any]) -> None:
        self._record(name, info)
        if self.inner is not None:
            self.inner(name, info)


class AsyncTrace(SyncTrace):
    """The ``trace`` callback of an async attempt (httpcore awaits it)."""

    __slots__ = ()

    async def __call__(self, name: str, info: dict[str, Any]) -> None:  # type: ignore[override]
        self._record(name, info)
        if self.inner is not None:
            await self.inner(name, info)


def program_trace(extensions: dict[str, Any]) -> Any:
    """The program's own ``trace`` callback, under any of ours left by an earlier send."""
    existing = extensions.get("trace")
    while isinstance(existing, SyncTrace):
        existing = existing.inner
    return existing
