"""The ``http2-stream-limit`` rule: requests that waited for a free stream on an HTTP/2
connection, because the server lets only so many run at once on it.

An HTTP/2 client (httpx with ``http2=True``) sends every request for an origin over one
connection, as many at once as the server's ``SETTINGS_MAX_CONCURRENT_STREAMS``; the others
wait in ``http.queue``. That queue is not a pool that is too small (raising ``max_connections``
does not open a second HTTP/2 connection), so :func:`~llm_latency.diagnosis.rules.pool_queue`
leaves HTTP/2 attempts to this rule.

A request that waited for the connection itself to open (the first requests on a new HTTP/2
connection wait for its set-up together) waited for no stream: a wait counts only when another
request to the same host ended during it, giving its stream back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from llm_latency import semconv
from llm_latency.diagnosis import claims
from llm_latency.diagnosis.findings import Evidence, Finding, Saving
from llm_latency.diagnosis.records import Attempt, Call
from llm_latency.timeline import QUEUE

#: http2-stream-limit: at least this share of the time waiting for a free stream...
STREAM_QUEUE_MIN_SHARE: Final = 0.05
#: ... by at least two requests that each waited at least this (s)...
STREAM_QUEUE_MIN_WAIT: Final = 0.005
#: ... until another request on the connection ended, at most this share of the wait later.
STREAM_RELEASE_SLACK: Final = 0.25


def _end(attempt: Attempt) -> int:
    return attempt.start_ns + int(attempt.duration * 1e9)


def _at(attempt: Attempt, name: str, end: bool = False) -> int | None:
    """When phase ``name`` of ``attempt`` started (or ended), in ns since the epoch."""
    for phase in attempt.phases:
        if phase.name == name:
            offset = phase.start + (phase.duration if end else 0.0)
            return attempt.start_ns + int(offset * 1e9)
    return None


def _streams_at_once(attempts: Sequence[Attempt]) -> int:
    """The most requests the server worked on at one instant: from the send to the first byte
    (a stream is given back only at the end of its response, but no answer comes for a
    request beyond the limit)."""
    edges: list[tuple[int, int]] = []
    for attempt in attempts:
        sent, first_byte = _at(attempt, "send"), _at(attempt, "wait", end=True)
        if sent is not None and first_byte is not None:
            edges.append((sent, 1))
            edges.append((first_byte, -1))
    peak = current = 0
    for _, step in sorted(edges):  # an end sorts before a start at the same instant
        current += step
        peak = max(peak, current)
    return peak


def _stream_waits(same_host: Sequence[Attempt]) -> list[tuple[Attempt, float]]:
    """The HTTP/2 requests that succeeded after waiting until another request (any, failed
    ones too) ended, and their queue times less the loop's hold in them: one ended during the
    wait, or by the time it was over (the attempt's end is taken once its stream is given
    back, so the waiting request may start first), within ``STREAM_RELEASE_SLACK`` of the
    wait. A failed attempt's time is the failure rules' and rate-limits'."""
    ends = sorted(_end(a) for a in same_host)
    waits = []
    for attempt in same_host:
        if not attempt.succeeded:
            continue
        queue = attempt.phase("queue") or 0.0
        # the loop's hold in the queue is event-loop-lag's and short-of-cpu's (as for
        # pool-queue)
        waited = attempt.net("queue") or 0.0
        if waited < STREAM_QUEUE_MIN_WAIT:
            continue
        start, done = _at(attempt, "queue"), _at(attempt, "queue", end=True)
        if start is None or done is None:
            continue
        slack = int(queue * STREAM_RELEASE_SLACK * 1e9)
        if any(start <= end <= done + slack for end in ends):
            waits.append((attempt, waited))
    return waits


def http2_stream_limit(calls: Sequence[Call]) -> Finding | None:
    """HTTP/2 requests queued behind the connection's stream limit."""
    attempts = [a for call in calls for a in call.attempts]
    by_host: dict[str, list[Attempt]] = {}
    for attempt in attempts:
        if attempt.protocol == "2":
            by_host.setdefault(attempt.host, []).append(attempt)
    found: list[tuple[Attempt, float]] = []
    streams = 0
    for same_host in by_host.values():
        waited = _stream_waits(same_host)
        if waited:
            found += waited
            streams = max(streams, _streams_at_once(same_host))
    waits = [seconds for _, seconds in found]
    share = sum(waits) / (sum(a.duration for a in attempts) or 1e-9)
    if len(waits) < 2 or share < STREAM_QUEUE_MIN_SHARE:
        return None
    evidence = Evidence.of(semconv.PHASE_SPAN_NAMES[QUEUE], waits, share, len(attempts))
    return Finding(
        rule="http2-stream-limit",
        cause=f"{len(waits)} HTTP/2 requests waited for a free stream: the server let "
        f"{streams} run at once on the connection (its SETTINGS_MAX_CONCURRENT_STREAMS)",
        evidence=evidence,
        fix="spread the requests over more connections: HTTP/1.1 with a pool as large as the "
        "concurrency (httpx http2=False, Limits(max_connections=...)), or one HTTP/2 client "
        f"per {streams} requests in flight; or send at most {streams} at once",
        saving=Saving(evidence.p50, evidence.p95, len(waits)),
        claims=claims.per_attempt(claims.QUEUE, found),
    )
