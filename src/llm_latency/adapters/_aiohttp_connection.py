"""How an aiohttp attempt gets its connection: the hooks that time its queue, dns, connect,
tls and proxy phases and see whether the connection was reused, and the connector read for the
pool metrics (the aiohttp adapter's connection side; see :mod:`llm_latency.adapters.aiohttp`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from llm_latency.adapters._aiohttp_attempt import (
    SessionRequest,
    arg,
    attempt_in_flight,
    session_request,
)
from llm_latency.adapters._hooks import SKIP
from llm_latency.adapters._resolver import is_ip_literal, socket_peer
from llm_latency.clock import clock_ns
from llm_latency.pools import ConnectionLifetimes, HostPort, PoolRow
from llm_latency.timeline import CONNECT, PROXY, TLS, Timeline


def _is_dns_cached(conn: Any, host: str, port: int) -> bool:
    """Whether ``_resolve_host`` will answer without a lookup (an IP literal or a cache hit)."""
    if is_ip_literal(host):
        return True
    if not conn._use_dns_cache:
        return False
    key = (host, port)
    cached = conn._cached_hosts
    return key in cached and not cached.expired(key)


def found(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    attempt = attempt_in_flight()
    return SKIP if attempt is None else attempt


def pooled(attempt: Timeline, connection: Any) -> Any:
    attempt.reused = connection is not None
    return connection


def attempt_of(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return attempt_in_flight()


def resolving(conn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The attempt whose host ``_resolve_host`` looks up, unless it answers without a lookup."""
    attempt = attempt_in_flight()
    host, port = arg(args, kwargs, 0, "host"), arg(args, kwargs, 1, "port")
    return None if attempt is None or _is_dns_cached(conn, host, port) else attempt


def connecting(conn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = session_request.get()
    attempt = None if call is None else call.attempt
    if call is not None and attempt is not None:
        call.tls_expected = bool(kwargs.get("ssl"))
        # Another address after a failed one: the phase goes on from its first start.
        attempt.resume(CONNECT)
    # The connection to a proxy's tunnel is counted once the tunnel is up (_proxy_connected).
    tunnel = call is not None and call.tunnel
    return attempt, conn, None if tunnel else kwargs.get("req")


def proxy_begins(conn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = session_request.get()
    if call is None:
        return SKIP
    req = arg(args, kwargs, 0, "req")
    call.tunnel = req.is_ssl()
    return call, conn, req


def proxy_fails(state: tuple[SessionRequest, Any, Any], exc: BaseException) -> None:
    state[0].tunnel = False


def tunnel_tls(conn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The attempt whose tunnel is up: the handshake with the target begins."""
    attempt = attempt_in_flight()
    if attempt is not None and attempt.current_phase == PROXY:
        attempt.end_phase(PROXY)
    return attempt


def tcp_connecting(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = session_request.get()
    return SKIP if call is None or call.attempt is None else call


def tcp_connected(call: SessionRequest, sock: Any) -> Any:
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


def read_connector(connector: Any, lifetimes: ConnectionLifetimes) -> Iterator[PoolRow]:
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
