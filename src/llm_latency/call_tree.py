"""Calls as compact text trees, with their findings: what ``llm-latency explain`` and the
``llm_latency_console`` span exporter print: :func:`tree` for the calls, then
:func:`finding_lines` for the findings of :func:`llm_latency.diagnose`.

Each line is a span of the call: its name (indented by depth), its start as an offset from the
first call's start, ``+`` its duration, then its facts::

    openai chat.completions               0 µs +  232 ms  attempts=2
      POST /v1/chat/completions           0 µs + 21.8 ms  status_code=429 connection=new ...
        http.connect                   14.3 ms +  5.3 ms
        ...
      retry.backoff                    21.8 ms +  152 ms  reason=429 retry_after=150 ms
      POST /v1/chat/completions         174 ms + 58.6 ms  status_code=200 resend_count=1 ...
    → 1 of 2 attempts were rate limited (429) ...
      fix: ...
      saves about 174 ms

With a ``width`` (the console exporter's ``COLUMNS``), no line is longer: a row's facts that
do not fit continue on lines of their own under the facts column (or deeper in the tree when
that column leaves too little room), a fact too long even for that is cut with ``…``, and the
findings are wrapped at spaces, never between a number and its unit.
"""

from __future__ import annotations

import os
import shutil
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO
from urllib.parse import urlsplit

from llm_latency import semconv
from llm_latency.diagnosis.findings import NBSP, Finding, duration, keep_units
from llm_latency.diagnosis.records import Attempt, Backoff, Call
from llm_latency.diagnosis.usage_hint import usage_hint
from llm_latency.timeline import PHASE_NAMES

INDENT = "  "
#: The narrowest name column, so that short trees line up with one another too.
MIN_NAME_WIDTH = 30
#: With a width, facts continue under their column only when it leaves them this much room.
MIN_FACTS_WIDTH = 24
#: The row of a wait between two attempts of the program's own retry loop (no span of its own:
#: the gap between them, :attr:`Backoff.inferred`).
OWN_RETRY_WAIT = "(wait before a retry)"


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
            # A wait of the program's own retry loop is no span: it is shown as what it is.
            name = OWN_RETRY_WAIT if member.inferred else semconv.BACKOFF_SPAN
            out.append(Row(1, name, start, member.duration, _backoff_facts(member)))
            continue
        out.append(Row(1, _attempt_name(member), start, member.duration, _attempt_facts(member)))
        for phase in member.phases:
            name = semconv.PHASE_SPAN_NAMES[PHASE_NAMES.index(phase.name)]
            out.append(Row(2, name, start + phase.start, phase.duration))
    return out


def tree(
    calls: Sequence[Call], origin_ns: int | None = None, width: int | None = None
) -> list[str]:
    """The lines of the trees of ``calls``, in one column layout; offsets from ``origin_ns``
    (default: the first call's start); no line longer than ``width`` when one is given."""
    if not calls:
        return []
    origin = min(call.start_ns for call in calls) if origin_ns is None else origin_ns
    ordered = sorted(calls, key=lambda call: call.start_ns)
    all_rows = [row for call in ordered for row in rows(call, origin)]
    name_width = max(MIN_NAME_WIDTH, *(len(INDENT * row.depth + row.name) for row in all_rows))
    starts = [duration(row.start) for row in all_rows]
    lengths = [duration(row.duration) for row in all_rows]
    start_width = max(len(text) for text in starts)
    length_width = max(len(text) for text in lengths)
    if width is not None:  # the name column gives way first, down to the narrowest
        times = 2 + start_width + 3 + length_width
        name_width = max(min(name_width, width - times), MIN_NAME_WIDTH)
    lines = []
    for row, start, length in zip(all_rows, starts, lengths, strict=True):
        name = _fit(INDENT * row.depth + row.name, name_width).ljust(name_width)
        head = f"{name}  {start:>{start_width}} + {length:>{length_width}}"
        lines += _with_facts(head, row, width)
    return lines


def _with_facts(head: str, row: Row, width: int | None) -> list[str]:
    """``head`` and the row's facts, on as many lines as ``width`` asks."""
    line = f"{head}  {' '.join(row.facts)}".rstrip()
    if width is None or len(line) <= width:
        return [line]
    indent = " " * (len(head) + 2)
    longest = max((len(fact) for fact in row.facts), default=0)
    if width - len(indent) < max(MIN_FACTS_WIDTH, longest):  # deeper in the tree instead
        indent = INDENT * (row.depth + 2)
    room = width - len(indent)
    lines = [_fit(head, width)]
    current = ""
    for fact in row.facts:
        fact = _fit(fact, room)
        if current and len(current) + 1 + len(fact) <= room:
            current += " " + fact
            continue
        if current:
            lines.append(indent + current)
        current = fact
    if current:
        lines.append(indent + current)
    if len(lines) > 1 and len(lines[0]) + 2 + len(lines[1]) - len(indent) <= width:
        lines[0:2] = [f"{lines[0]}  {lines[1][len(indent) :]}"]  # the first facts on the row
    return lines


def _fit(text: str, width: int) -> str:
    """``text``, cut to ``width`` columns with ``…`` when longer."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _wrap(text: str, width: int | None, indent: str, subsequent: str) -> list[str]:
    """``text`` as lines of at most ``width`` (one line when None), broken at spaces but never
    between a number and its unit."""
    if width is None:
        return [indent + text]
    lines = textwrap.wrap(
        keep_units(text), width, initial_indent=indent, subsequent_indent=subsequent,
        break_on_hyphens=False,
    )  # fmt: skip
    return [line.replace(NBSP, " ") for line in lines] or [indent]


def finding_lines(findings: Sequence[Finding], width: int | None = None) -> list[str]:
    """Each finding as its three lines, the first marked with an arrow (wrapped to ``width``,
    continuation lines indented)."""
    if not findings:
        return ["→ no findings"]
    lines = []
    for finding in findings:
        first, *rest = finding.lines()
        lines += _wrap(first, width, "→ ", "    ")
        for line in rest:
            lines += _wrap(line, width, "  ", "      ")
    return lines


def calls_with_hint(
    calls: Sequence[Call], origin_ns: int | None = None, width: int | None = None
) -> list[str]:
    """The trees of ``calls``, then the hint of a stream that carried no usage, if any; no
    line longer than ``width`` when one is given."""
    hint = usage_hint(a for call in calls for a in call.attempts)
    hints = _wrap(hint, width, "", "  ") if hint is not None else []
    return tree(calls, origin_ns, width) + hints


def columns_for(out: TextIO) -> int | None:
    """The width to fit: ``COLUMNS``, else the terminal's if ``out`` is one; None (no limit)
    for a file or a pipe. Never under 40."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit():
        return max(int(columns), 40)
    try:
        if out.isatty():
            return max(shutil.get_terminal_size().columns, 40)
    except (AttributeError, ValueError, OSError):  # a closed or unusual stream
        pass
    return None


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
    if attempt.time_to_first_token is not None:
        facts.append(f"first_token={duration(attempt.time_to_first_token)}")
    if attempt.stream_events:
        facts.append(f"events={attempt.stream_events}")
    if attempt.input_tokens is not None:
        facts.append(f"input_tokens={attempt.input_tokens}")
    if attempt.output_tokens is not None:
        facts.append(f"output_tokens={attempt.output_tokens}")
    if attempt.time_per_output_token is not None:
        facts.append(f"per_token={duration(attempt.time_per_output_token)}")
    elif attempt.server_time_per_output_token_max is not None and (attempt.output_tokens or 0) > 1:
        # The prefill is in the server's time: only a bound of the pace (3 times it for 5
        # tokens after a 400 ms first byte). For one token it is the server's time, shown.
        bound = duration(attempt.server_time_per_output_token_max)
        facts.append(f"per_token≤{bound} (server/output_tokens)")
    return tuple(facts)


def _backoff_facts(backoff: Backoff) -> tuple[str, ...]:
    facts = []
    if backoff.reason is not None:
        facts.append(f"reason={backoff.reason}")
    if backoff.retry_after is not None:
        facts.append(f"retry_after={duration(backoff.retry_after)}")
    return tuple(facts)
