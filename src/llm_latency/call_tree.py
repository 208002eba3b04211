"""Calls as compact text trees, with their findings: what ``llm-latency explain`` and the
``llm_latency_console`` span exporter print, from one function (:func:`report`).

Each line is a span of the call: its name (indented by depth), its start as an offset from the
first call's start, ``+`` its duration, then its facts::

    openai POST /chat/completions         0 µs +  232 ms  attempts=2
      POST /v1/chat/completions           0 µs + 21.8 ms  status_code=429 connection=new ...
        http.connect                   14.3 ms +  5.3 ms
        ...
      retry.backoff                    21.8 ms +  152 ms  reason=429 retry_after=150 ms
      POST /v1/chat/completions         174 ms + 58.6 ms  status_code=200 resend_count=1 ...
    → 1 of 2 attempts were rate limited (429) ...
      fix: ...
      saves about 174 ms
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from llm_latency import semconv
from llm_latency.diagnosis import diagnose
from llm_latency.diagnosis.findings import Finding, duration
from llm_latency.diagnosis.records import Attempt, Backoff, Call
from llm_latency.timeline import PHASE_NAMES

INDENT = "  "
#: The narrowest name column, so that short trees line up with one another too.
MIN_NAME_WIDTH = 30


@dataclass(frozen=True)
class Row:
    """One line of a tree: a span's name and depth, start (s after the origin), duration (s)
    and facts (``key=value`` words)."""

    depth: int
    name: str
    start: float
    duration: float
    facts: tuple[str, ...] = ()


def rows(call: Call, origin_ns: int) -> list[Row]:
    """The rows of ``call``: the call, then its attempts (each with its phases) and the backoffs
    between them, in start order; times from ``origin_ns``."""
    out = [Row(0, call.name, _offset(call.start_ns, origin_ns), call.duration, _call_facts(call))]
    members: list[Attempt | Backoff] = [*call.attempts, *call.backoffs]
    members.sort(key=lambda member: member.start_ns)
    for member in members:
        start = _offset(member.start_ns, origin_ns)
        if isinstance(member, Backoff):
            out.append(Row(1, semconv.BACKOFF_SPAN, start, member.duration, _backoff_facts(member)))
            continue
        out.append(Row(1, _attempt_name(member), start, member.duration, _attempt_facts(member)))
        for phase in member.phases:
            name = semconv.PHASE_SPAN_NAMES[PHASE_NAMES.index(phase.name)]
            out.append(Row(2, name, start + phase.start, phase.duration))
    return out


def tree(calls: Sequence[Call], origin_ns: int | None = None) -> list[str]:
    """The lines of the trees of ``calls``, in one column layout; offsets from ``origin_ns``
    (default: the first call's start)."""
    if not calls:
        return []
    origin = min(call.start_ns for call in calls) if origin_ns is None else origin_ns
    ordered = sorted(calls, key=lambda call: call.start_ns)
    all_rows = [row for call in ordered for row in rows(call, origin)]
    width = max(MIN_NAME_WIDTH, *(len(INDENT * row.depth + row.name) for row in all_rows))
    starts = [duration(row.start) for row in all_rows]
    lengths = [duration(row.duration) for row in all_rows]
    start_width = max(len(text) for text in starts)
    length_width = max(len(text) for text in lengths)
    lines = []
    for row, start, length in zip(all_rows, starts, lengths, strict=True):
        name = (INDENT * row.depth + row.name).ljust(width)
        line = f"{name}  {start:>{start_width}} + {length:>{length_width}}  {' '.join(row.facts)}"
        lines.append(line.rstrip())
    return lines


def finding_lines(findings: Sequence[Finding]) -> list[str]:
    """Each finding as its three lines, the first marked with an arrow."""
    if not findings:
        return ["→ no findings"]
    lines = []
    for finding in findings:
        first, *rest = finding.lines()
        lines.append(f"→ {first}")
        lines += [f"  {line}" for line in rest]
    return lines


def report(calls: Sequence[Call], origin_ns: int | None = None) -> list[str]:
    """The trees of ``calls``, then the findings of :func:`llm_latency.diagnose` for them."""
    return tree(calls, origin_ns) + finding_lines(diagnose(calls))


def _offset(start_ns: int, origin_ns: int) -> float:
    return (start_ns - origin_ns) / 1e9


def _call_facts(call: Call) -> tuple[str, ...]:
    facts = [f"attempts={len(call.attempts)}"]
    if call.backoffs:
        facts.append(f"backoff={duration(call.backoff_time)}")
    return tuple(facts)


def _attempt_name(attempt: Attempt) -> str:
    path = urlsplit(attempt.url).path if attempt.url else ""
    return " ".join(part for part in (attempt.method, path or attempt.host) if part) or "request"


def _attempt_facts(attempt: Attempt) -> tuple[str, ...]:
    facts = []
    if attempt.status is not None:
        facts.append(f"status_code={attempt.status}")
    if attempt.error is not None:
        facts.append(f"error={attempt.error}")
    if attempt.failed_phase is not None:
        facts.append(f"failed_phase={attempt.failed_phase}")
    if attempt.resend_count:
        facts.append(f"resend_count={attempt.resend_count}")
    if attempt.reused is not None:
        facts.append(f"connection={'pooled' if attempt.reused else 'new'}")
    if attempt.request_id:
        facts.append(f"request_id={attempt.request_id}")
    if "retry-after-ms" in attempt.ratelimit:
        facts.append(f"retry-after-ms={attempt.ratelimit['retry-after-ms']}")
    if attempt.server_processing is not None:
        facts.append(f"server={duration(attempt.server_processing)}")
    if attempt.time_to_first_chunk is not None:
        facts.append(f"first_chunk={duration(attempt.time_to_first_chunk)}")
    if attempt.stream_events:
        facts.append(f"events={attempt.stream_events}")
    return tuple(facts)


def _backoff_facts(backoff: Backoff) -> tuple[str, ...]:
    facts = []
    if backoff.reason is not None:
        facts.append(f"reason={backoff.reason}")
    if backoff.retry_after is not None:
        facts.append(f"retry_after={duration(backoff.retry_after)}")
    return tuple(facts)
