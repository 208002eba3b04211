"""Timing name resolution inside a TCP connect, for clients whose network layer resolves and
connects in one call (httpcore's backends, urllib3).

The resolver functions they call are wrapped: ``anyio``'s ``getaddrinfo`` (httpcore's async
backend) and ``socket.getaddrinfo`` (httpcore's sync backend and urllib3, through
``socket.create_connection`` or directly). The wrappers record only when the calling thread or
task has an attempt in its ``connect`` phase; every other caller passes straight through.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from llm_latency.adapters._patching import Patches
from llm_latency.timeline import CONNECT, DNS, Timeline, _now

#: The attempt whose connection the current thread or task is opening, if any.
connecting: ContextVar[Timeline | None] = ContextVar("llm_latency_connecting", default=None)


def _is_ip_literal(host: Any) -> bool:
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    try:
        ipaddress.ip_address(str(host).strip("[]"))
    except ValueError:
        return False
    return True


def _attempt_resolving(host: Any) -> Timeline | None:
    attempt = connecting.get()
    if attempt is None or attempt.ended or attempt.current_phase != CONNECT:
        return None
    if _is_ip_literal(host):
        return None
    return attempt


def _record(attempt: Timeline, start: int, end: int) -> None:
    # The lookup ran inside the connect phase: it becomes the dns phase, and connect starts
    # after it.
    attempt.begin(DNS, start)
    attempt.finish(DNS, end)
    attempt.begin(CONNECT, end)


def _wrap_sync(original: Callable[..., Any]) -> Callable[..., Any]:
    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        attempt = _attempt_resolving(host)
        if attempt is None:
            return original(host, *args, **kwargs)
        start = _now()
        attempt.begin(DNS, start)  # left open if the lookup fails: the failure is in dns
        result = original(host, *args, **kwargs)
        _record(attempt, start, _now())
        return result

    return getaddrinfo


def _wrap_async(original: Callable[..., Any]) -> Callable[..., Any]:
    async def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        attempt = _attempt_resolving(host)
        if attempt is None:
            return await original(host, *args, **kwargs)
        start = _now()
        attempt.begin(DNS, start)
        result = await original(host, *args, **kwargs)
        _record(attempt, start, _now())
        return result

    return getaddrinfo


class _ResolverHooks:
    """Installed while at least one adapter needs them."""

    def __init__(self) -> None:
        self._users = 0
        self._lock = threading.Lock()
        self._patches = Patches()

    def acquire(self) -> None:
        with self._lock:
            self._users += 1
            if self._users > 1:
                return
            self._patches.replace(socket, "getaddrinfo", _wrap_sync(socket.getaddrinfo))
            try:
                from anyio._core import _sockets as anyio_sockets
            except ImportError:  # anyio is optional (httpcore's sync backend needs none)
                return
            self._patches.replace(
                anyio_sockets, "getaddrinfo", _wrap_async(anyio_sockets.getaddrinfo)
            )

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                self._patches.restore()


resolver_hooks = _ResolverHooks()
