"""Where an aiohttp attempt is found (the request's context variable, then its body stream),
and the hooks that move it through its send, wait and receive phases: the aiohttp adapter's
request side (:mod:`llm_latency.adapters.aiohttp` starts and ends the attempt).
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection
from contextvars import ContextVar
from typing import Any

from opentelemetry.trace import Span

from llm_latency import forks
from llm_latency.adapters._hooks import SKIP
from llm_latency.adapters._resolver import peer_address
from llm_latency.live_state import register
from llm_latency.suppression import tracing_allowed
from llm_latency.timeline import PROXY, RECEIVE, SEND, WAIT, Timeline


class SessionRequest:
    """One ``ClientSession._request`` call: its attempt in flight and how many it made."""

    __slots__ = ("attempt", "attempts", "last", "tls_expected", "tunnel")

    def __init__(self) -> None:
        self.attempt: Timeline | None = None
        self.last: Span | None = None  # the request span of the attempt before
        self.attempts = 0
        self.tls_expected = False
        #: A proxy's CONNECT tunnel is being opened: its exchange is no request of the program's.
        self.tunnel = False


session_request: ContextVar[SessionRequest | None] = ContextVar(
    "llm_latency_aiohttp_call", default=None
)


# An attempt has one owner at a time, where its hooks find it: until the response headers, the
# ``ClientSession._request`` call running in this task (``session_request``); from the
# headers on, its response body stream, here (the body arrives in the connection's callbacks,
# outside the request's task). StreamReader has __slots__, so the attempt cannot ride on the
# stream itself. Keyed by the stream's id, not the stream: a stream holds its loop, its
# connection's socket and, by a read's waiter, the task reading it, and a program that drops
# its loop unclosed with a body unread drops them all. The entry goes with the stream: the
# response's release, close or collection (``__del__``, hooked) ends its attempt first.
streams: dict[int, Timeline] = {}
# A forked child's streams are its own: the parent's attempts are not the child's to end.
forks.at_fork(streams.clear)
register("aiohttp_streams", lambda: len(streams))


def forget_streams(attempts: Collection[Timeline]) -> None:
    """The emitter forgot ``attempts`` (their loop closed or went first): their streams'
    entries go too, now rather than when the program lets go of the responses."""
    if attempts:
        for key, attempt in list(streams.items()):
            if attempt in attempts:
                streams.pop(key, None)


def reset(token: Any) -> None:
    """The request's context variable back as it was, where it can be, on the failure path: a
    request whose task was destroyed (its loop closed with it in flight) is unwound by the
    collector, outside the task's context, and the request still ends."""
    with contextlib.suppress(ValueError):  # "created in a different Context"
        session_request.reset(token)


def attempt_in_flight() -> Timeline | None:
    call = session_request.get()
    return None if call is None else call.attempt


def arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs[name]


def request_begins(session: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not tracing_allowed():
        return SKIP
    call = SessionRequest()
    return call, session_request.set(call)


def attempt_fails(attempt: Timeline, exc: BaseException) -> None:
    attempt.fail(exc)


def send_begins(req: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = session_request.get()
    attempt = None if call is None or call.tunnel else call.attempt
    if attempt is None:
        return SKIP
    if attempt.peer_address is None:  # a pooled connection
        transport = arg(args, kwargs, 0, "conn").transport
        if transport is not None:
            attempt.peer_address = peer_address(transport.get_extra_info("peername"))
    if attempt.current_phase == PROXY:  # the tunnel's handshake was not seen
        attempt.advance(SEND)
    else:
        attempt.begin(SEND)
    return attempt, req


def request_sent(attempt: Timeline) -> None:
    if attempt.current_phase == SEND:
        attempt.advance(WAIT)


def response_starts(response: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = session_request.get()
    attempt = None if call is None or call.tunnel else call.attempt
    if call is None or attempt is None:
        return SKIP
    return call, attempt, response


def response_fails(state: tuple[SessionRequest, Timeline, Any], exc: BaseException) -> None:
    state[1].fail(exc)


def headers_received(attempt: Timeline, response: Any) -> None:
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


def body_read(stream: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # Asked per read: whether the stream is an attempt's is left to the failure, where
    # ``_end_body`` finds it or not.
    return stream


def body_chunk(stream: Any, data: bytes) -> None:
    """A body chunk reached a response's ``StreamReader`` (a ``Tap``: per chunk, kept cheap)."""
    if data:
        attempt = streams.get(id(stream))
        if attempt is not None:
            attempt.chunk(data)
