"""httpcore's HTTP/2 paths (httpx or httpx2 with ``http2=True``): the waits that are not a
pool's, and the HTTP/2 connections in the pool metrics.

With HTTP/2, httpcore's pool hands every request for an origin to one connection, even while
that connection is still being opened, and the connection then lets as many requests through
at once as the server's ``SETTINGS_MAX_CONCURRENT_STREAMS`` allows (one, until the server's
SETTINGS arrive). A request beyond that waits for a free stream
(``HTTP2Connection._max_streams_semaphore``) before it sends anything: that is a ``queue``
phase, like a wait for a pool's free connection. The phase begins only when the semaphore is
taken at that moment (a request that goes straight through has no queue phase) and ends when
the request starts to send its headers. (The wait of the first requests for the connection
another request is opening is not hooked: a hook on ``HTTPConnection.handle_async_request``
changed how a cancelled request ends, in tests/test_httpx_failures.py; it stays a gap.)

Each ``HTTP2Connection`` is one connection of the pool metrics (active while
it carries a stream); ``http.client.active_requests`` counts each request on it.

Without the ``h2`` package httpcore has no HTTP/2, and none of this is hooked.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from llm_latency.adapters._hooks import SKIP, Hook
from llm_latency.adapters._patching import PatchSet
from llm_latency.pools import ConnectionLifetimes
from llm_latency.timeline import QUEUE, Timeline

#: The attempt the running task (or thread) is sending through an httpcore pool, if any.
current_attempt: ContextVar[Timeline | None] = ContextVar(
    "llm_latency_httpcore_attempt", default=None
)


def is_taken(primitive: Any) -> bool:
    """Whether one of httpcore's locks or semaphores would make its caller wait now. Each wraps
    the running backend's own (made at its first use: before that, nothing holds it)."""
    for name in ("_anyio_lock", "_trio_lock", "_lock"):
        lock = getattr(primitive, name, None)
        if lock is not None:
            return bool(lock.locked())
    for name in ("_anyio_semaphore", "_trio_semaphore"):
        semaphore = getattr(primitive, name, None)
        if semaphore is not None:
            return bool(semaphore.value == 0)
    semaphore = getattr(primitive, "_semaphore", None)  # threading.Semaphore
    return semaphore is not None and getattr(semaphore, "_value", 1) == 0


def _queue_if(waits: bool) -> Any:
    """Begin (or go on with) the queue phase of the current attempt if it is about to wait."""
    attempt = current_attempt.get()
    if attempt is None or not waits:
        return SKIP
    if attempt.current_phase in (None, QUEUE):
        attempt.resume(QUEUE)
    return SKIP


def _stream_wait(semaphore: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``Semaphore.acquire`` (httpcore uses it for HTTP/2 streams only): none is free."""
    return _queue_if(is_taken(semaphore))


def install(
    patches: PatchSet,
    module: str,
    lifetimes: ConnectionLifetimes,
    opened: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any],
) -> None:
    """Hook ``module``'s (httpcore's or httpcore2's) HTTP/2 paths, when ``h2`` is installed.
    ``opened``: the adapter's hook for a connection built on its network stream."""
    if importlib.util.find_spec("h2") is None:
        return
    closed = Hook(lifetimes.on_close)
    patches.group(
        "HTTP/2 connections in the pool metrics",
        [
            (f"{module}._sync.http2:HTTP2Connection", "__init__", Hook(opened)),
            (f"{module}._sync.http2:HTTP2Connection", "close", closed),
            (f"{module}._async.http2:AsyncHTTP2Connection", "__init__", Hook(opened)),
            (f"{module}._async.http2:AsyncHTTP2Connection", "aclose", closed),
        ],
    )
    patches.group(
        "the queue phase of HTTP/2 requests",
        [
            (f"{module}._synchronization:Semaphore", "acquire", Hook(_stream_wait)),
            (f"{module}._synchronization:AsyncSemaphore", "acquire", Hook(_stream_wait)),
        ],
    )
