"""``pool-queue``: requests that waited for a free connection in the client's pool, and what a
larger pool saves once the connections it adds have paid their set-up.

The saving is read from a replay of the requests through the pool, per host: each request
arrives when it did and holds a connection for as long as it did (its time less its wait in
the queue and its own set-up); a free connection serves it at once, else a new one if the pool
has room (its set-up first: the host's p50 of the set-ups seen), else the first to be freed.
Replayed with the pool's size seen and with the size the fix gives, the difference is what the
fix brings: the batch's wall time, or each request's p50 when the requests are spread out
(:mod:`~llm_latency.diagnosis.seen`).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from llm_latency import semconv
from llm_latency.diagnosis import claims
from llm_latency.diagnosis.advice import pool_fix, pool_text
from llm_latency.diagnosis.connections import NEW_CONNECTION_MIN_SETUP
from llm_latency.diagnosis.findings import Evidence, Finding, duration, percentile
from llm_latency.diagnosis.measured import (
    MIN_REQUESTS,
    answered,
    by_host,
    interval,
    sustained_peak,
)
from llm_latency.diagnosis.measured import total as _total
from llm_latency.diagnosis.records import SETUP_PHASES, Attempt, Call
from llm_latency.diagnosis.seen import modelled_saving
from llm_latency.timeline import QUEUE

#: pool-queue: at least this share of the time waiting in ``http.queue``...
QUEUE_MIN_SHARE: Final = 0.05
#: ... by at least two requests that each waited at least this (s).
QUEUE_MIN_WAIT: Final = 0.005


def setup_time(attempt: Attempt) -> float:
    """The attempt's own connection set-up as it took (s; 0 on a pooled connection)."""
    return sum(p.duration for p in attempt.phases if p.name in SETUP_PHASES)


def held(attempt: Attempt) -> float:
    """How long the attempt held its connection (s): its time less its wait and set-up."""
    return max(attempt.duration - (attempt.phase("queue") or 0.0) - setup_time(attempt), 0.0)


@dataclass(frozen=True)
class Replay:
    """The requests of one host through a pool: each one's time (s, in start order) and when
    the last one ended (s after the origin)."""

    times: list[float]
    end: float


def replay(same_host: Sequence[Attempt], size: int, setup: float, origin_ns: int) -> Replay:
    """``same_host``'s requests (in start order) through a pool of ``size`` connections, each
    new one costing ``setup`` s first."""
    free: list[float] = []  # when each open connection is free again
    opened = 0
    times = []
    end = 0.0
    for attempt in same_host:
        arrival = (attempt.start_ns - origin_ns) / 1e9
        if free and free[0] <= arrival:
            heapq.heappop(free)
            start = arrival
        elif opened < size:
            opened += 1
            start = arrival + setup
        else:
            start = max(heapq.heappop(free), arrival)
        done = start + held(attempt)
        heapq.heappush(free, done)
        times.append(done - arrival)
        end = max(end, done)
    return Replay(times, end)


def pool_queue(calls: Sequence[Call]) -> Finding | None:
    """Requests waited for a free connection in the client's pool."""
    attempts = answered(calls)
    pooled = [a for a in attempts if a.protocol != "2"]  # HTTP/2 queues: http2_stream_limit
    waits = [q for a in pooled if (q := a.net("queue") or 0.0) >= QUEUE_MIN_WAIT]
    share = sum(waits) / _total(attempts)
    if len(waits) < MIN_REQUESTS or share < QUEUE_MIN_SHARE:
        return None
    hosts = by_host(attempts)
    # Levels of concurrency that lasted: a connection handed from one request to the next
    # overlaps the two for an instant, which is no larger pool.
    held = {h: [interval(a, True) for a in same] for h, same in hosts.items()}
    wanted = {h: sustained_peak([interval(a) for a in same], held[h]) for h, same in hosts.items()}
    in_use = {h: sustained_peak(held[h]) for h in hosts}
    everywhere = sustained_peak(
        [interval(a) for a in attempts], [interval(a, True) for a in attempts]
    )
    origin = min(a.start_ns for a in attempts)
    before: list[float] = []
    after: list[float] = []
    gained: list[tuple[Attempt, float]] = []
    ends = [0.0, 0.0]
    added = 0
    setups: list[float] = []
    for host, same in hosts.items():
        same = sorted(same, key=lambda a: a.start_ns)
        opened = [setup_time(a) for a in same if a.opened_connection]
        setup = percentile(opened, 50) if opened else 0.0
        old = replay(same, in_use[host], setup, origin)
        new = replay(same, max(wanted[host], in_use[host]), setup, origin)
        for attempt, was, is_now in zip(same, old.times, new.times, strict=True):
            # A larger pool shortens a request by its wait in the queue at most; the loop's
            # hold in that wait is event-loop-lag's and short-of-cpu's.
            gain = min(max(was - is_now, 0.0), attempt.net("queue") or 0.0)
            before.append(was)
            after.append(was - gain)
            gained.append((attempt, gain))
        ends = [max(ends[0], old.end), max(ends[1], new.end)]
        added += max(wanted[host] - in_use[host], 0)
        setups += [setup] * max(wanted[host] - in_use[host], 0)
    most, served = max(wanted.values()), max(in_use.values())
    evidence = Evidence.of(
        semconv.PHASE_SPAN_NAMES[QUEUE], waits, share, len(attempts), needed=MIN_REQUESTS
    )
    change = pool_fix(attempts, most, everywhere)
    fix = pool_text(change, attempts, served, most)
    if added and setups and percentile(setups, 50) >= NEW_CONNECTION_MIN_SETUP:
        fix += (
            f"; the {added} connections it adds pay their set-up first "
            f"({duration(percentile(setups, 50))} each), which the saving counts"
        )
    saving = modelled_saving(calls_of(calls, attempts), before, after, (ends[0], ends[1]))
    return Finding(
        rule="pool-queue",
        cause=f"{len(waits)} requests waited for a free connection: {most} were in flight at "
        f"once on a pool that served {served} at a time",
        evidence=evidence,
        fix=fix,
        saving=saving,
        change=change,
        claims=claims.per_attempt(claims.QUEUE, gained),
    )


def calls_of(calls: Sequence[Call], attempts: Sequence[Attempt]) -> list[Call]:
    """The calls that hold any of ``attempts``."""
    chosen = {id(a) for a in attempts}
    return [call for call in calls if any(id(a) in chosen for a in call.attempts)]
