"""The connection pool over time, for the terminal: samples of ``http.client.open_connections``
and ``llm_latency.pool.waiting`` for one host, taken while a scene runs, drawn as bars."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field

from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from rich.table import Table
from rich.text import Text

from llm_latency import semconv

#: Colours of the pool's bars, as the phase colours of ``render``: active like the wait it
#: carries, waiting like the queue phase.
_ACTIVE, _IDLE, _WAITING = "#e4572e", "#76b041", "#9b5de5"


@dataclass(frozen=True)
class PoolState:
    """The pool to one host at one moment."""

    at: float
    active: int
    idle: int
    waiting: int
    limit: int | None


def read_pool(reader: InMemoryMetricReader, host: str, at: float = 0.0) -> PoolState:
    """The pool to ``host`` now (summed over ports and pools)."""
    active = idle = waiting = 0
    limit: int | None = None
    data = reader.get_metrics_data()
    metrics = (
        metric
        for resource in (data.resource_metrics if data is not None else ())
        for scope in resource.scope_metrics
        for metric in scope.metrics
    )
    for metric in metrics:
        for point in metric.data.data_points:
            attributes = point.attributes or {}
            if attributes.get(semconv.SERVER_ADDRESS) != host:
                continue
            value = int(getattr(point, "value", 0))
            if metric.name == semconv.HTTP_CLIENT_OPEN_CONNECTIONS:
                if attributes.get(semconv.HTTP_CONNECTION_STATE) == "active":
                    active += value
                else:
                    idle += value
            elif metric.name == semconv.POOL_WAITING:
                waiting += value
            elif metric.name == semconv.POOL_LIMIT:
                limit = (limit or 0) + value
    return PoolState(at, active, idle, waiting, limit)


@dataclass
class PoolWatch:
    """Samples of one host's pool, without repeats."""

    states: list[PoolState] = field(default_factory=list)

    def add(self, state: PoolState) -> None:
        last = self.states[-1] if self.states else None
        if last is None or (last.active, last.idle, last.waiting) != (
            state.active,
            state.idle,
            state.waiting,
        ):
            self.states.append(state)


@asynccontextmanager
async def watching(
    reader: InMemoryMetricReader, host: str, every: float = 0.05
) -> AsyncIterator[PoolWatch]:
    """Sample the pool to ``host`` every ``every`` seconds while the block runs (and once
    after it)."""
    watch = PoolWatch()
    start = time.monotonic()

    async def sample() -> None:
        while True:
            watch.add(read_pool(reader, host, time.monotonic() - start))
            await asyncio.sleep(every)

    task = asyncio.create_task(sample())
    try:
        yield watch
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task
        watch.add(read_pool(reader, host, time.monotonic() - start))


def pool_table(states: Sequence[PoolState]) -> Table:
    """One row per change: a bar of active, idle and waiting, against the limit."""
    table = Table(title="the pool to the host over time", title_justify="left", box=None)
    table.add_column("at", justify="right")
    table.add_column("█ active ▒ idle · free | ░ waiting")
    for column in ("active", "idle", "waiting", "limit"):
        table.add_column(column, justify="right")
    for state in states:
        bar = Text()
        bar.append("█" * state.active, style=_ACTIVE)
        bar.append("▒" * state.idle, style=_IDLE)
        free = max((state.limit or 0) - state.active - state.idle, 0)
        bar.append("·" * free)
        bar.append(" | ")
        bar.append("░" * state.waiting, style=_WAITING)
        table.add_row(
            f"{state.at * 1000:.0f} ms",
            bar,
            str(state.active),
            str(state.idle),
            str(state.waiting),
            "-" if state.limit is None else str(state.limit),
        )
    return table
