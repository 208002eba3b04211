"""Timing name resolution inside a TCP connect, for clients whose network layer resolves and
connects in one call (httpcore's backends, urllib3).

The resolver functions they call are hooked: ``anyio``'s ``getaddrinfo`` (httpcore's async
backend) and ``socket.getaddrinfo`` (httpcore's sync backend and urllib3, through
``socket.create_connection`` or directly). The hooks record only when the calling thread or
task has an attempt in its ``connect`` phase; every other caller passes straight through.
"""

from __future__ import annotations

import importlib.util
import ipaddress
from contextvars import ContextVar
from typing import Any

from llm_latency import forks
from llm_latency.adapters._hooks import SKIP, FaultReporter, Hook
from llm_latency.adapters._patching import PatchSet
from llm_latency.timeline import CONNECT, DNS, Timeline

#: The attempt whose connection the current thread or task is opening, if any.
connecting: ContextVar[Timeline | None] = ContextVar("llm_latency_connecting", default=None)


def is_ip_literal(host: Any) -> bool:
    """Whether ``host`` (str or bytes, IPv6 possibly in brackets) is an IP address."""
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    try:
        ipaddress.ip_address(str(host).strip("[]"))
    except ValueError:
        return False
    return True


def peer_address(sockaddr: Any) -> str | None:
    """The address of a socket's peer (``getpeername()``, or a transport's ``peername``)."""
    if isinstance(sockaddr, tuple) and sockaddr and isinstance(sockaddr[0], str):
        return sockaddr[0]
    return None


def socket_peer(sock: Any) -> str | None:
    """The address a connected socket went to; None once it is no longer connected."""
    try:
        return peer_address(sock.getpeername())
    except (OSError, AttributeError):
        return None


def _lookup_begins(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    attempt = connecting.get()
    if attempt is None or attempt.ended or attempt.current_phase != CONNECT:
        return SKIP
    if is_ip_literal(args[0] if args else kwargs.get("host")):
        return SKIP
    # The lookup runs inside the connect phase: it becomes the dns phase, and connect starts
    # over after it. Left open if the lookup fails: the failure is in dns, and no connect
    # phase exists.
    attempt.discard(CONNECT)
    attempt.begin(DNS)
    return attempt


def _lookup_ends(attempt: Timeline, result: Any) -> Any:
    attempt.advance(CONNECT)  # the lookup (dns) ends, the TCP connect begins
    return result


_LOOKUP = Hook(_lookup_begins, _lookup_ends)


class _ResolverHooks:
    """Installed while at least one adapter needs them."""

    def __init__(self) -> None:
        self._users = 0
        self._lock = forks.lock()
        self._patches: PatchSet | None = None

    def acquire(self, report: FaultReporter) -> list[str]:
        """Install the hooks (the first user's ``report`` hears of faults); return what is
        lost."""
        with self._lock:
            self._users += 1
            if self._patches is not None:
                return list(self._patches.lost)
            patches = self._patches = PatchSet("dns", report)
            patches.group("the dns phase (sync)", [("socket", "getaddrinfo", _LOOKUP)])
            if importlib.util.find_spec("anyio") is not None:  # httpcore's sync side needs none
                patches.group(
                    "the dns phase (async)", [("anyio._core._sockets", "getaddrinfo", _LOOKUP)]
                )
            return list(patches.lost)

    def release(self) -> None:
        """One user is done; the last one takes the hooks out."""
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._patches is not None:
                self._patches.restore()
                self._patches = None


resolver_hooks = _ResolverHooks()
