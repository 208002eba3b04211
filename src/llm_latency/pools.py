"""The connection pool made visible: open connections (active, idle), requests waiting for one,
the pool's limit, requests in flight, and each connection's lifetime (docs/telemetry.md, Metrics).

Nothing is added to the request path:

- the counts are read when the SDK collects: connections from the pools themselves (each adapter
  gives a :data:`PoolReader` for its library's pool, and registers a pool when it opens its
  first connection), requests from the attempts in flight;
- a connection's lifetime is recorded when it closes, from hooks that run once per connection
  (:class:`ConnectionLifetimes`).

Only connections opened while the plugin is on are counted: one opened before ``instrument()``
has no known host or start. A connection still being opened (DNS, TCP, TLS) is not open yet.

A host's series fall back to 0 when it has nothing open or in flight (a closed session, an idle
program), instead of vanishing at their last value, and leave once it has had nothing for
:data:`HOST_MAX_AGE`: a program that called a thousand hosts once does not report them forever.
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from opentelemetry.metrics import CallbackOptions, Histogram, Meter, Observation

from llm_latency import forks, semconv
from llm_latency.live_state import register
from llm_latency.observables import Observer
from llm_latency.timeline import QUEUE

if TYPE_CHECKING:
    from llm_latency.attempt_record import AttemptRecord

HostPort = tuple[str, "int | None"]

#: One pool's connections to one host: (host, port), active, idle, and the most connections the
#: pool may open to that host (None: no limit).
PoolRow = tuple[HostPort, int, int, "int | None"]

#: Reads one pool (a connector, a connection pool) of a client library; may raise when the
#: library changed, and the pool is then left out.
PoolReader = Callable[[Any, "ConnectionLifetimes"], Iterable[PoolRow]]

_ACTIVE = semconv.HttpConnectionStateValues.ACTIVE.value
_IDLE = semconv.HttpConnectionStateValues.IDLE.value

#: Seconds a host stays in the pool series (at 0) after it last had a connection open or a
#: request in flight at a collection, as a rate-limit value stays in its gauge
#: (``metrics.RATELIMIT_MAX_AGE``).
HOST_MAX_AGE = 300.0

_ALL: weakref.WeakSet[PoolMetrics] = weakref.WeakSet()
register("pools_watched", lambda: sum(len(p._pools) for p in list(_ALL)))
register("pool_hosts", lambda: sum(p.hosts_kept() for p in list(_ALL)))


def limit_or_none(value: int | None) -> int | None:
    """A pool's connection limit, or None when it has none (0, None, or ``sys.maxsize``)."""
    if not value or value >= sys.maxsize:
        return None
    return value


class ConnectionLifetimes:
    """The connections open now, with their host and the time each one opened; records each
    one's lifetime in ``http.client.connection.duration`` when it closes."""

    def __init__(
        self, histogram: Histogram | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._histogram = histogram
        self._clock = clock
        self._lock = forks.lock()
        self._open: weakref.WeakKeyDictionary[Any, tuple[float, HostPort]] = (
            weakref.WeakKeyDictionary()
        )

    def opened(self, connection: Any, host: str, port: int | None) -> None:
        """``connection`` to ``host``:``port`` is established (TCP, and TLS if any)."""
        with self._lock:
            self._open[connection] = (self._clock(), (host, port))

    def closed(self, connection: Any) -> None:
        """``connection`` closed; a second close, or one never seen open, records nothing."""
        with self._lock:
            found = self._open.pop(connection, None)
        if found is None or self._histogram is None:
            return
        opened_at, (host, port) = found
        attributes: dict[str, Any] = {semconv.SERVER_ADDRESS: host}
        if port is not None:
            attributes[semconv.SERVER_PORT] = port
        self._histogram.record(max(self._clock() - opened_at, 0.0), attributes)

    def on_close(self, connection: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A hook run before a connection's close method (a ``Hook``'s ``before``)."""
        self.closed(connection)

    def host_of(self, connection: Any) -> HostPort | None:
        """The host ``connection`` was opened to, if it was opened while the plugin was on."""
        with self._lock:
            found = self._open.get(connection)
        return None if found is None else found[1]

    def is_open(self, connection: Any) -> bool:
        """Whether ``connection`` opened (while the plugin was on) and has not closed."""
        with self._lock:
            return connection in self._open

    def forget(self) -> None:
        """Stop tracking every connection (the plugin is off: their closes go unseen)."""
        with self._lock:
            self._open.clear()


def _attributes(key: HostPort, state: str | None = None) -> dict[str, Any]:
    host, port = key
    attributes: dict[str, Any] = {semconv.SERVER_ADDRESS: host}
    if port is not None:
        attributes[semconv.SERVER_PORT] = port
    if state is not None:
        attributes[semconv.HTTP_CONNECTION_STATE] = state
    return attributes


class PoolMetrics:
    """The pools an instrumentation reads, what the pool instruments report of them
    (:meth:`observers`, for ``observables``), and the connection lifetimes it records."""

    def __init__(
        self,
        meter: Meter | None,
        in_flight: Callable[[], Iterable[AttemptRecord]],
        report: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._in_flight = in_flight
        self._report = report
        self._clock = clock
        self._lock = forks.lock()
        self._pools: weakref.WeakKeyDictionary[Any, PoolReader] = weakref.WeakKeyDictionary()
        # The hosts each series reports, with when each last had something to count (see the
        # module's docstring).
        self._connection_hosts: dict[HostPort, float] = {}
        self._request_hosts: dict[HostPort, float] = {}
        _ALL.add(self)
        self.lifetimes = ConnectionLifetimes(None)
        if meter is not None:
            self.use_meter(meter)

    def use_meter(self, meter: Meter) -> None:
        """Record the connections' lifetimes into ``meter``'s histogram from now on."""
        self.lifetimes._histogram = meter.create_histogram(
            semconv.HTTP_CLIENT_CONNECTION_DURATION,
            unit="s",
            description="How long each connection stayed open, from established to closed.",
            explicit_bucket_boundaries_advisory=semconv.CONNECTION_DURATION_BUCKETS,
        )

    def observers(self) -> dict[str, Observer]:
        """What the pool instruments read, by instrument name."""
        return {
            semconv.HTTP_CLIENT_OPEN_CONNECTIONS: self._observe_connections,
            semconv.POOL_LIMIT: self._observe_limits,
            semconv.POOL_WAITING: self._observe_waiting,
            semconv.HTTP_CLIENT_ACTIVE_REQUESTS: self._observe_requests,
        }

    def watch(self, pool: Any, reader: PoolReader) -> None:
        """Read ``pool`` with ``reader`` at each collection, for as long as the pool lives."""
        if pool in self._pools:
            return
        with self._lock:
            self._pools[pool] = reader

    def forget(self) -> None:
        """Stop reading every pool and tracking every connection (the plugin is off)."""
        with self._lock:
            self._pools.clear()
            self._connection_hosts.clear()
            self._request_hosts.clear()
        self.lifetimes.forget()

    def hosts_kept(self) -> int:
        """How many hosts the series keep now (a host in both kinds of series counts twice)."""
        return len(self._connection_hosts) + len(self._request_hosts)

    def _recent(self, hosts: dict[HostPort, float], seen: Iterable[HostPort]) -> list[HostPort]:
        """The hosts a series reports: those ``seen`` now, and those seen within the last
        :data:`HOST_MAX_AGE` seconds; older ones leave ``hosts``."""
        now = self._clock()
        oldest = now - HOST_MAX_AGE
        with self._lock:
            for key in seen:
                hosts[key] = now
            for key in [key for key, last in hosts.items() if last < oldest]:
                del hosts[key]
            return list(hosts)

    # -- collection ---------------------------------------------------------------------------

    def _rows(self) -> Iterator[PoolRow]:
        with self._lock:
            pools = list(self._pools.items())
        for pool, reader in pools:
            try:
                rows = list(reader(pool, self.lifetimes))
            except RuntimeError:
                continue  # the pool changed under the read (another thread): next time
            except Exception:
                self._report("reading a connection pool")
                continue
            yield from rows

    def _observe_connections(self, _options: CallbackOptions) -> Iterable[Observation]:
        counts: dict[HostPort, list[int]] = {}
        for key, active, idle, _limit in self._rows():
            total = counts.setdefault(key, [0, 0])
            total[0] += active
            total[1] += idle
        observations = []
        for key in self._recent(self._connection_hosts, counts):
            active, idle = counts.get(key, (0, 0))
            observations.append(Observation(active, _attributes(key, _ACTIVE)))
            observations.append(Observation(idle, _attributes(key, _IDLE)))
        return observations

    def _observe_limits(self, _options: CallbackOptions) -> Iterable[Observation]:
        # Pools reaching one host add up; one pool without a limit makes the whole unlimited.
        limits: dict[HostPort, int | None] = {}
        for key, _active, _idle, limit in self._rows():
            if key in limits:
                known = limits[key]
                limits[key] = None if known is None or limit is None else known + limit
            else:
                limits[key] = limit
        return [Observation(limit, _attributes(key)) for key, limit in limits.items() if limit]

    def _observe_in_flight(self, queued_only: bool) -> list[Observation]:
        counts: dict[HostPort, int] = {}
        for attempt in self._in_flight():
            if not attempt.host or (queued_only and attempt.timeline.current_phase != QUEUE):
                continue
            key = (attempt.host, attempt.port)
            counts[key] = counts.get(key, 0) + 1
        return [
            Observation(counts.get(key, 0), _attributes(key))
            for key in self._recent(self._request_hosts, counts)
        ]

    def _observe_waiting(self, _options: CallbackOptions) -> Iterable[Observation]:
        return self._observe_in_flight(queued_only=True)

    def _observe_requests(self, _options: CallbackOptions) -> Iterable[Observation]:
        return self._observe_in_flight(queued_only=False)
