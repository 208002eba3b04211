"""The requests adapter's view of urllib3's connection pools (``pools``): a pool is read when
the SDK collects, from the first connection object it makes (``_new_conn``); a connection opens
at the end of ``HTTPConnection.connect`` and closes at ``close``.

A pool keeps its connection objects and opens a dropped one again in place, without a new
``_new_conn``: a pool that made its connections under an earlier instrumentation is read by
the next one from the start (:data:`_MARKED`), or the connections it opens then would never be.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from functools import partial
from typing import Any, Final

from llm_latency.adapters._hooks import Hook
from llm_latency.adapters._patching import Target
from llm_latency.pools import ConnectionLifetimes, PoolMetrics, PoolRow
from llm_latency.suppression import tracing_allowed

POOL: Final = "urllib3.connectionpool:HTTPConnectionPool"
HTTPS_POOL: Final = "urllib3.connectionpool:HTTPSConnectionPool"
CONNECTION: Final = "urllib3.connection:HTTPConnection"
HTTPS_CONNECTION: Final = "urllib3.connection:HTTPSConnection"
#: The connections a pool made (a weak set on the pool), to tell its checked-out ones.
_MADE: Final = "_llm_latency_connections"
#: Every pool alive that carries :data:`_MADE`.
_MARKED: weakref.WeakSet[Any] = weakref.WeakSet()


def pool_hooks(pools: PoolMetrics) -> list[Target]:
    """The hooks that keep ``pools`` up to date with urllib3's pools and connections; ``pools``
    reads the pools already marked at once."""
    for pool in list(_MARKED):
        pools.watch(pool, _read_pool)
    made = Hook(_itself, partial(_connection_made, pools))
    opened = Hook(_itself, partial(_connection_opened, pools.lifetimes))
    return [
        (POOL, "_new_conn", made),
        (HTTPS_POOL, "_new_conn", made),
        (CONNECTION, "connect", opened),
        (HTTPS_CONNECTION, "connect", opened),
        (CONNECTION, "close", Hook(pools.lifetimes.on_close)),
    ]


def _itself(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return instance


def _connection_made(pools: PoolMetrics, pool: Any, connection: Any) -> Any:
    """``pool`` made a connection object (it connects when first used). Not one made where
    instrumentation is suppressed (an OTLP exporter's own): it is not the program's."""
    if not tracing_allowed():
        return connection
    members = pool.__dict__.get(_MADE)
    if members is None:
        members = pool.__dict__.setdefault(_MADE, weakref.WeakSet())
        _MARKED.add(pool)
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
    members = pool.__dict__.get(_MADE)
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
