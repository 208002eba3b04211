"""What the rules look at: the attempts of the calls, split into those that succeeded (the only
ones a latency rule reads: a failure is never diagnosed as slowness) and the rest, and the
small measures the rules share (sums, overlaps, the client library in use).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from llm_latency.diagnosis.findings import percentile
from llm_latency.diagnosis.records import Attempt, Call

#: A finding about latency needs at least this many requests that show it...
MIN_REQUESTS: Final = 2
#: ... and the levels of concurrency a pool finding reads must last at least this share of the
#: usual request: a hand-over between two requests on one connection overlaps for an instant.
MIN_OVERLAP_SHARE: Final = 0.25


def attempts(calls: Sequence[Call]) -> list[Attempt]:
    """Every attempt of ``calls``."""
    return [a for call in calls for a in call.attempts]


def answered(calls: Sequence[Call]) -> list[Attempt]:
    """The attempts that succeeded: what every latency rule measures."""
    return [a for a in attempts(calls) if a.succeeded]


def total(chosen: Sequence[Attempt]) -> float:
    """The attempts' summed duration (s), never 0 (a share's denominator)."""
    return sum(a.duration for a in chosen) or 1e-9


def by_host(chosen: Sequence[Attempt]) -> dict[str, list[Attempt]]:
    """The attempts per ``server.address``."""
    hosts: dict[str, list[Attempt]] = {}
    for attempt in chosen:
        hosts.setdefault(attempt.host, []).append(attempt)
    return hosts


def interval(attempt: Attempt, skip_queue: bool = False) -> tuple[int, int]:
    """The attempt's span in ns since the epoch; ``skip_queue``: from the end of its wait for a
    pooled connection, to the end of its last phase (when it held the connection)."""
    start = attempt.start_ns
    end = attempt.start_ns + int(attempt.duration * 1e9)
    if skip_queue:
        start += int((attempt.phase("queue") or 0.0) * 1e9)
        if attempt.phases:
            last = attempt.phases[-1]
            end = attempt.start_ns + int((last.start + last.duration) * 1e9)
    return start, max(end, start)


def peak(intervals: Sequence[tuple[int, int]], min_hold: int = 0) -> int:
    """The largest number of ``intervals`` that overlap, held for at least ``min_hold`` ns (an
    overlap shorter than that is a hand-over, not concurrency); at least 1 when any."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    best = current = 0
    since = 0
    for at, step in edges:  # an end sorts before a start at the same instant (-1 < 1)
        if at - since >= min_hold:  # the level since the last edge lasted long enough
            best = max(best, current)
        current += step
        since = at
    return max(best, 1 if intervals else 0)


def sustained_peak(
    intervals: Sequence[tuple[int, int]], usual: Sequence[tuple[int, int]] | None = None
) -> int:
    """:func:`peak`, counting only levels held for :data:`MIN_OVERLAP_SHARE` of the median
    length of ``usual`` (by default the intervals themselves). Intervals that include a wait
    for a connection give ``usual`` as the same attempts held their connections: a hand-over
    is short next to a request's service, while a long queue would stretch the median past
    the burst's whole peak (sixty at once through five connections hold their level of sixty
    for one service time, an eighth of their median length)."""
    lengths = [end - start for start, end in (intervals if usual is None else usual)]
    if not lengths:
        return 0
    return peak(intervals, int(percentile(lengths, 50) * MIN_OVERLAP_SHARE))


def clients(chosen: Iterable[Attempt]) -> set[str]:
    """The client libraries the attempts name (``llm_latency.client``)."""
    return {a.client for a in chosen if a.client}
