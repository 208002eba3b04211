"""Which seconds a finding's saving counts: two findings never claim the same seconds.

Each attempt's time is laid out in parts that do not overlap (:func:`layout`): the wait for a
pooled connection or a stream (:data:`QUEUE`), the connection's set-up (:data:`SETUP`), the
program's own loop stall (:data:`STALL`) and the machine's wait for a CPU (:data:`CPU`) in any
phase, the network's and the provider edge's overhead (:data:`OVERHEAD`), and the provider's
time: for a streamed answer until its first token (:data:`FIRST`) and after it
(:data:`DECODE`), for one read whole in one piece (:data:`ANSWER`). A failed attempt is one
part (:data:`FAILED`), a backoff between two attempts another (:data:`BACKOFF`).

A rule that gives a saving says which seconds it counts: a :class:`Claim` per attempt (or
backoff) and part. Findings that claim seconds in the same part of the same attempt each take
their own: their claims there add up to no more than the part (:func:`over_claimed`, which the
tests hold every pair of rules to). Where two fixes would remove the same seconds, one finding
gives way and its fix says whose they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from llm_latency.diagnosis.baselines import first_token
from llm_latency.diagnosis.findings import Claim, Finding, duration
from llm_latency.diagnosis.model import Attempt, Backoff

__all__ = [
    "ANSWER",
    "BACKOFF",
    "CPU",
    "DECODE",
    "FAILED",
    "FIRST",
    "OVERHEAD",
    "QUEUE",
    "SETUP",
    "STALL",
    "TOLERANCE",
    "Claim",
    "claim",
    "claimed",
    "cpu_wait",
    "layout",
    "loop_stall",
    "over_claimed",
    "per_attempt",
    "room",
]

#: The wait for a pooled connection or an HTTP/2 stream, less the loop's hold in it.
QUEUE: Final = "queue"
#: DNS, proxy, TCP and TLS, less the loop's hold in them.
SETUP: Final = "set-up"
#: The program's own event-loop stall, in any phase.
STALL: Final = "loop stall"
#: The machine's wait for a CPU (the loop's thread off a CPU), in any phase.
CPU: Final = "cpu wait"
#: The send-to-first-byte time that is neither the server's nor this side's.
OVERHEAD: Final = "network overhead"
#: A streamed answer: the provider's time to its first token (prompt, queue, reasoning).
FIRST: Final = "first token"
#: A streamed answer: its time after the first token (its tokens, its pauses).
DECODE: Final = "decode"
#: An answer read whole: the provider's time and the body, first token and decode in one.
ANSWER: Final = "answer"
#: A failed attempt, whole.
FAILED: Final = "failed attempt"
#: The wait between two attempts of a call.
BACKOFF: Final = "backoff"

#: Claims may exceed their part by this much (s): the spans' times are whole nanoseconds.
TOLERANCE: Final = 1e-6


def loop_stall(attempt: Attempt) -> float:
    """The program's own loop stall in the attempt (s): its phases' lag when the phase spans
    carry it (what their net time leaves out), else the attempt's whole lag."""
    lags = [p.lag for p in attempt.phases if p.lag is not None]
    return sum(lags) if lags else attempt.event_loop_lag or 0.0


def cpu_wait(attempt: Attempt) -> float:
    """The machine's wait for a CPU in the attempt (s): its phases' shares when the phase spans
    carry them (what their net time leaves out), else the attempt's whole wait."""
    shares = [p.descheduled for p in attempt.phases if p.descheduled is not None]
    return sum(shares) if shares else attempt.descheduled or 0.0


def layout(of: Attempt | Backoff) -> dict[str, float]:
    """The parts of an attempt's (or a backoff's) time, in seconds; they do not overlap."""
    if isinstance(of, Backoff):
        return {BACKOFF: of.duration}
    if not of.succeeded:
        return {FAILED: of.duration}
    sizes = {
        QUEUE: of.net("queue") or 0.0,
        SETUP: of.connection_setup,
        STALL: loop_stall(of),
        CPU: cpu_wait(of),
        OVERHEAD: max(of.network_overhead or 0.0, 0.0),
    }
    rest = max(of.duration - sum(sizes.values()), 0.0)
    first = first_token(of)
    if first is None:
        sizes[ANSWER] = rest
    else:
        sizes[FIRST] = min(first, rest)
        sizes[DECODE] = rest - sizes[FIRST]
    return sizes


def room(attempt: Attempt, part: str) -> float:
    """The size of ``part`` of ``attempt`` (s), :data:`FIRST` and :data:`DECODE` being its
    :data:`ANSWER` when it was read whole; 0 when it has no such part."""
    return layout(attempt).get(claim(attempt, part, 0.0).part, 0.0)


def claim(of: Attempt | Backoff, part: str, seconds: float) -> Claim:
    """A claim of ``seconds`` of ``part`` of ``of``; the provider's first token and decode of
    an answer read whole are its :data:`ANSWER`."""
    if part in (FIRST, DECODE) and isinstance(of, Attempt) and first_token(of) is None:
        part = ANSWER
    return Claim(of, part, seconds)


def per_attempt(
    part: str, pairs: Iterable[tuple[Attempt, float]] | Iterable[tuple[Backoff, float]]
) -> tuple[Claim, ...]:
    """The claims of ``part`` of each attempt (or backoff) of ``pairs``, with the seconds
    each; none for nothing saved."""
    return tuple(claim(of, part, seconds) for of, seconds in pairs if seconds > 0)


def claimed(findings: Sequence[Finding]) -> dict[tuple[int, str], float]:
    """The seconds ``findings`` claim, per attempt (or backoff: by ``id``) and part."""
    taken: dict[tuple[int, str], float] = {}
    for finding in findings:
        for each in finding.claims:
            key = (id(each.of), each.part)
            taken[key] = taken.get(key, 0.0) + each.seconds
    return taken


def over_claimed(findings: Sequence[Finding]) -> list[str]:
    """Where the findings' claims in one part of one attempt add up to more than the part: one
    line each, naming the findings, the part, both amounts and the attempt. Empty when no two
    findings claim the same seconds (and none claims more than there was)."""
    whose: dict[tuple[int, str], list[str]] = {}
    subjects: dict[int, Attempt | Backoff] = {}
    for finding in findings:
        for each in finding.claims:
            subjects[id(each.of)] = each.of
            whose.setdefault((id(each.of), each.part), []).append(finding.rule)
    found = []
    for (subject, part), seconds in claimed(findings).items():
        of = subjects[subject]
        size = layout(of).get(part)
        if size is None or seconds > size + TOLERANCE:
            what = "no such part" if size is None else duration(size)
            found.append(
                f"{' + '.join(whose[subject, part])} claim {duration(seconds)} of {part} "
                f"({what}) of {_named(of)}"
            )
    return found


def _named(of: Attempt | Backoff) -> str:
    if isinstance(of, Backoff):
        return f"the backoff at {of.start_ns} ns"
    return f"the attempt {of.span_id or of.request_id or of.url or '?'} at {of.start_ns} ns"
