"""What a user will see of a saving: a batch's wall time, or each call's p50.

A rule knows what its fix removes from each call (a connection's set-up, a wait beyond the
server's ``retry-after``, a lookup a cache would have answered). What the program then shows
depends on how its calls ran: calls that kept it busy (a batch: their time covers at least
:data:`BATCH_MIN_BUSY` of the span from the first call's start to the last one's end) finish
sooner by the seconds removed over the concurrency at which they ran; calls spread over time
(a service answering its own requests) are each shorter, and what the user sees is their p50.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from llm_latency.diagnosis.findings import P50, WALL, Saving, percentile
from llm_latency.diagnosis.records import Call

#: Calls form a batch when their time covers at least this share of the span from the first
#: call's start to the last one's end.
BATCH_MIN_BUSY: Final = 0.8


def bounds(call: Call) -> tuple[int, int]:
    """A call's start and end, ns since the epoch."""
    return call.start_ns, call.start_ns + int(call.duration * 1e9)


def covered(intervals: Sequence[tuple[int, int]]) -> int:
    """The length (ns) of the union of ``intervals``."""
    length = 0
    reach: int | None = None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            length += end - start
            reach = end
        elif end > reach:
            length += end - reach
            reach = end
    return length


def wall_time(calls: Sequence[Call]) -> float:
    """Seconds from the first call's start to the last one's end (0 for no call)."""
    if not calls:
        return 0.0
    spans = [bounds(call) for call in calls]
    return (max(end for _, end in spans) - min(start for start, _ in spans)) / 1e9


def is_batch(calls: Sequence[Call]) -> bool:
    """Whether the calls kept the program busy (:data:`BATCH_MIN_BUSY`)."""
    whole = wall_time(calls)
    return whole > 0 and covered([bounds(call) for call in calls]) / 1e9 >= BATCH_MIN_BUSY * whole


def concurrency(calls: Sequence[Call]) -> float:
    """How many calls ran at once on average while any ran (at least 1)."""
    busy = covered([bounds(call) for call in calls]) / 1e9
    if busy <= 0:
        return 1.0
    return max(sum(call.duration for call in calls) / busy, 1.0)


def seen_saving(calls: Sequence[Call], removed: Sequence[float]) -> Saving | None:
    """The saving a user will see when ``removed[i]`` seconds go from ``calls[i]``: for a batch
    (:func:`is_batch`), its wall time shorter by the seconds removed over the concurrency
    (:data:`~llm_latency.diagnosis.findings.WALL`; p50 and p95 of what each call concerned
    loses); else each call's p50 (:data:`~llm_latency.diagnosis.findings.P50`; when it does
    not move, per call on those that gain). None when nothing is removed."""
    gains = [gone for gone in removed if gone > 0]
    if not gains:
        return None
    if is_batch(calls):
        seen = min(sum(gains) / concurrency(calls), wall_time(calls))
        return Saving(percentile(gains, 50), percentile(gains, 95), len(gains), WALL, seen)
    before = [call.duration for call in calls]
    after = [max(call.duration - gone, 0.0) for call, gone in zip(calls, removed, strict=True)]
    p50 = percentile(before, 50) - percentile(after, 50)
    p95 = percentile(before, 95) - percentile(after, 95)
    if p50 <= 0:  # the p50 does not move: what the calls that gain gain
        return Saving(percentile(gains, 50), percentile(gains, 95), len(gains))
    return Saving(p50, max(p95, 0.0), len(calls), P50, p50)


def modelled_saving(
    calls: Sequence[Call],
    before: Sequence[float],
    after: Sequence[float],
    walls: tuple[float, float],
) -> Saving | None:
    """A saving from a model of the requests before and after the fix (the pool's simulation):
    each request's time ``before`` and ``after`` (s) and the batch's wall time before and after
    (``walls``). For a batch (:func:`is_batch`) its wall time
    (:data:`~llm_latency.diagnosis.findings.WALL`, with the p50 and p95 of what each request
    that gains gains), else each request's p50
    (:data:`~llm_latency.diagnosis.findings.P50`; when it does not move, per request on those
    that gain). None when the model shows no gain, or none on the batch's wall time."""
    gains = [b - a for b, a in zip(before, after, strict=True) if b - a > 0]
    if not gains:
        return None
    if is_batch(calls):
        seen = walls[0] - walls[1]
        if seen <= 0:
            return None
        return Saving(percentile(gains, 50), percentile(gains, 95), len(gains), WALL, seen)
    p50 = percentile(before, 50) - percentile(after, 50)
    p95 = percentile(before, 95) - percentile(after, 95)
    if p50 <= 0:  # the p50 does not move: what the requests that gain gain
        return Saving(percentile(gains, 50), percentile(gains, 95), len(gains))
    return Saving(p50, max(p95, 0.0), len(before), P50, p50)
