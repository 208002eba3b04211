"""From measurements to a diagnosis: finished calls in, findings with fixes and savings out.

:func:`diagnose` is the one engine behind ``probe``, the demo, ``explain`` and the development
exporter. It reads llm-latency's own span model, so it works on the SDK's finished spans, on
spans read back from a trace file, or on :class:`Call` records.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from llm_latency.diagnosis.failures import FAILURE_RULES
from llm_latency.diagnosis.findings import Evidence, Finding, Fix, Saving
from llm_latency.diagnosis.records import (
    Attempt,
    Backoff,
    Call,
    SpanRecord,
    calls_from_spans,
    from_readable_spans,
)
from llm_latency.diagnosis.rules import RULES
from llm_latency.diagnosis.seen import concurrency, is_batch
from llm_latency.diagnosis.tokens import without_superseded
from llm_latency.diagnosis.us_or_them import program_calls, us_or_them

__all__ = [
    "Attempt",
    "Backoff",
    "Call",
    "Evidence",
    "Finding",
    "Fix",
    "Saving",
    "SpanRecord",
    "calls_from_spans",
    "diagnose",
    "from_readable_spans",
]


def as_calls(items: Iterable[Any]) -> list[Call]:
    """Calls from a mix of :class:`Call`, :class:`Attempt`, :class:`SpanRecord` and the SDK's
    finished spans (``ReadableSpan``); spans are grouped into calls by their parents."""
    calls: list[Call] = []
    spans: list[SpanRecord] = []
    readable: list[Any] = []
    for item in items:
        if isinstance(item, Call):
            calls.append(item)
        elif isinstance(item, Attempt):
            calls.append(Call(item.method or "request", item.start_ns, item.duration, [item]))
        elif isinstance(item, SpanRecord):
            spans.append(item)
        elif hasattr(item, "context") and hasattr(item, "instrumentation_scope"):
            readable.append(item)
        else:
            raise TypeError(f"cannot diagnose a {type(item).__name__}: pass calls or spans")
    spans += from_readable_spans(readable)
    return calls + calls_from_spans(spans)


def rank(finding: Finding, concurrency: float = 1.0) -> tuple[int, float]:
    """The order of the findings: failures first (a failed call is worse than a slow one), the
    most frequent first; then the largest expected saving (:meth:`Saving.ranked`: the wall time
    a batch saves, else the seconds saved over the requests, over the ``concurrency`` of a
    batch)."""
    if finding.rule in FAILURE_RULES:
        return (0, -finding.evidence.share)
    return (1, -(finding.saving.ranked(concurrency) if finding.saving is not None else 0.0))


def diagnose(calls: Iterable[Any]) -> list[Finding]:
    """Findings for ``calls`` (finished calls or spans): failures first, then the largest
    expected saving first.

    A rule that does not apply says nothing: a healthy run has no findings, and a finding
    whose evidence is short of its own minimum (count, share) is left out, and so is one that a
    token finding stands in for (``server-time`` when the tokens say why the provider took its
    time: :data:`~llm_latency.diagnosis.tokens.SUPERSEDED`). Each finding names
    the cause, its evidence (phase, share of the time, p50 and p95, how many requests) and the
    fix with the saving it should bring, computed from these measurements.
    """
    records = as_calls(calls)
    own = program_calls(records)  # the probe's calls (llm-latency watch) are only compared
    if not any(call.attempts for call in own):
        return []
    findings = [finding for rule in RULES if (finding := rule(own)) is not None]
    findings = without_superseded([finding for finding in findings if finding.evidence.enough])
    findings += us_or_them(records, findings)
    spread = concurrency(own) if is_batch(own) else 1.0
    findings.sort(key=lambda finding: rank(finding, spread))
    return findings
