"""``rate-limits``: refusals (429), what became of the calls refused, and what the waits cost.

A call is retried when it has more than one attempt: retries the client or the SDK counted,
those of ``llm_latency.retry`` (with their ``retry.backoff`` spans), and those of a loop of
the program's own, which :func:`~llm_latency.diagnosis.grouping.calls_from_spans` recognises
(the same request again under the same parent after a refusal, the wait an inferred backoff).
When the waits before the retries were longer than the server asked (``retry-after-ms``,
``retry-after``), honouring it is the fix and the time beyond is the saving; when they were as
asked, what is left to save is the refusals themselves and their waits (a client-side rate
limit under the provider's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from llm_latency.diagnosis import claims
from llm_latency.diagnosis.advice import retry_fix
from llm_latency.diagnosis.findings import Evidence, Finding, Saving, duration, percentile
from llm_latency.diagnosis.measured import attempts as all_attempts
from llm_latency.diagnosis.records import Backoff, Call
from llm_latency.diagnosis.seen import seen_saving

#: rate-limits: at least this share of the attempts answered 429...
RATE_LIMITED_MIN_SHARE: Final = 0.05
#: A wait before a retry is longer than the server asked when it is longer by at least this
#: (s)...
RETRY_WAIT_MIN_EXCESS: Final = 0.01
#: ... and by at least this share of what it asked.
RETRY_WAIT_MIN_EXCESS_SHARE: Final = 0.2

_RATE_LIMIT_FIX = (
    "limit the request rate on the client side (a token bucket under the provider's "
    "x-ratelimit-limit-requests) and honour retry-after (the SDKs do; a loop of one's own "
    "can use llm_latency.retry)"
)


def overwait(backoff: Backoff) -> float:
    """Seconds a wait lasted beyond what the server asked, when that is more than
    :data:`RETRY_WAIT_MIN_EXCESS` and :data:`RETRY_WAIT_MIN_EXCESS_SHARE` of it (else 0)."""
    beyond = backoff.beyond_asked
    asked = backoff.retry_after or 0.0
    if beyond is None or beyond < max(RETRY_WAIT_MIN_EXCESS, RETRY_WAIT_MIN_EXCESS_SHARE * asked):
        return 0.0
    return beyond


def rate_limits(calls: Sequence[Call]) -> Finding | None:
    """Many 429s: refused calls, and the time retries and backoffs cost."""
    everything = all_attempts(calls)
    limited = sum(1 for a in everything if a.status == 429)
    if not everything or not limited or limited < RATE_LIMITED_MIN_SHARE * len(everything):
        return None
    affected = [call for call in calls if any(a.status == 429 for a in call.attempts)]
    retried = sum(len(call.attempts) - 1 for call in affected)
    head = f"{limited} of {len(everything)} attempts were rate limited (429)"
    if not retried:
        # Refused and not retried: those calls failed. What a limit saves is the failure
        # itself, not the few ms a 429 takes; the evidence is the share of the requests.
        evidence = Evidence.of(
            "429 responses",
            [a.duration for a in everything if a.status == 429],
            limited / len(everything),
            len(everything),
            share_of="the requests",
            min_share=RATE_LIMITED_MIN_SHARE,
        )
        return Finding(
            rule="rate-limits",
            cause=f"{head} and none was retried: those calls failed",
            evidence=evidence,
            fix=_RATE_LIMIT_FIX,
            saving=None,
        )
    whole = sum(call.duration for call in calls) or 1e-9  # backoffs included
    beyond = [sum(overwait(b) for b in call.backoffs) for call in calls]
    if any(beyond):
        return _waits_too_long(calls, affected, beyond, whole, f"{head} and {retried}")
    # Per call that was refused: its failed attempts' time and its backoffs.
    lost = [
        sum(a.duration for a in call.attempts if not a.succeeded) + call.backoff_time
        for call in affected
    ]
    backoff = sum(call.backoff_time for call in affected)
    evidence = Evidence.of(
        "failed attempts + retry.backoff", lost, sum(lost) / whole, len(calls), unit="calls"
    )
    return Finding(
        rule="rate-limits",
        cause=f"{head} and {retried} {'was a retry' if retried == 1 else 'were retries'}; "
        f"{duration(backoff)} went to retry.backoff",
        evidence=evidence,
        fix=_RATE_LIMIT_FIX,
        saving=Saving(evidence.p50, evidence.p95, len(lost)),
        claims=claims.per_attempt(
            claims.FAILED,
            [(a, a.duration) for call in affected for a in call.attempts if not a.succeeded],
        )
        + claims.per_attempt(
            claims.BACKOFF, [(b, b.duration) for call in affected for b in call.backoffs]
        ),
    )


def _waits_too_long(
    calls: Sequence[Call],
    affected: Sequence[Call],
    beyond: Sequence[float],
    whole: float,
    head: str,
) -> Finding:
    """The retries waited longer than the server asked: honouring ``retry-after`` saves the
    time beyond it."""
    waits = [b for call in affected for b in call.backoffs if overwait(b) > 0]
    own = any(b.inferred for b in waits)
    asked = [b.retry_after or 0.0 for b in waits]
    waited = [b.duration for b in waits]
    retries = "retries by the program's own loop (the same request again under one span, " \
        "no retry.backoff spans)" if own else "retries"  # fmt: skip
    evidence = Evidence.of(
        "waits beyond retry-after",
        [gone for gone in beyond if gone > 0],
        sum(beyond) / whole,
        len(calls),
        unit="calls",
    )
    change = retry_fix(max(len(call.attempts) for call in affected))
    return Finding(
        rule="rate-limits",
        cause=f"{head} were {retries}; {len(waits)} of the waits before them lasted "
        f"{duration(percentile(waited, 50))} at p50 where the server asked for "
        f"{duration(percentile(asked, 50))} (retry-after)",
        evidence=evidence,
        fix=f"honour retry-after: {change.text()}, which waits what retry-after-ms or "
        f"Retry-After asks (or make the loop sleep that long, not "
        f"{duration(percentile(waited, 50))}); and limit the request rate on the client side "
        "(a token bucket under the provider's x-ratelimit-limit-requests)",
        saving=seen_saving(calls, beyond),
        change=change,
        claims=claims.per_attempt(
            claims.BACKOFF, [(b, overwait(b)) for call in calls for b in call.backoffs]
        ),
    )
