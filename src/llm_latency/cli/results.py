"""From exported spans to per-request results and percentiles: what the CLI shows.

The CLI measures with llm-latency itself: it instruments its own clients, collects the finished
spans in memory, and reads each request span and its phase children back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from llm_latency import semconv
from llm_latency.diagnosis.findings import percentile
from llm_latency.diagnosis.records import (
    Attempt,
    SpanRecord,
    from_readable_spans,
    is_attempt,
    to_attempt,
    to_backoff,
)
from llm_latency.timeline import PHASE_NAMES


class SpanCollector(SpanProcessor):
    """Keeps every finished span in memory."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []
        #: What the last ``take()`` returned: the CLI diagnoses the spans ``probe_url`` read.
        self.taken: list[ReadableSpan] = []
        self._lock = threading.Lock()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Nothing to do when a span starts."""

    def on_end(self, span: ReadableSpan) -> None:
        """Keep the finished span."""
        with self._lock:
            self.spans.append(span)

    def take(self) -> list[ReadableSpan]:
        """The spans collected so far, and forget them."""
        with self._lock:
            spans, self.spans = self.spans, []
        self.taken = spans
        return spans


@dataclass
class PhaseTiming:
    """One phase of a request: where it starts (s after the request's start) and how long."""

    name: str
    start: float
    duration: float


@dataclass
class RequestResult:
    """One HTTP attempt, as the CLI reports it."""

    url: str
    status: int | None
    total: float
    phases: dict[str, float]
    timings: list[PhaseTiming]
    start: float = 0.0
    request_id: str | None = None
    time_to_first_chunk: float | None = None
    server_processing: float | None = None
    network_overhead: float | None = None
    event_loop_lag: float | None = None
    stream_events: int | None = None
    reused: bool | None = None
    ratelimit: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    failed_phase: str | None = None
    resend_count: int = 0
    kind: str = "request"

    def as_json(self) -> dict[str, Any]:
        """The JSON form of ``probe --json``."""
        data = asdict(self)
        data.pop("timings")
        return data

    @classmethod
    def of(cls, attempt: Attempt, origin_ns: int) -> RequestResult:
        """The result of ``attempt``, placed in time from ``origin_ns``."""
        return cls(
            url=attempt.url,
            status=attempt.status,
            total=attempt.duration,
            phases={p.name: p.duration for p in attempt.phases},
            timings=[PhaseTiming(p.name, p.start, p.duration) for p in attempt.phases],
            start=(attempt.start_ns - origin_ns) / 1e9,
            request_id=attempt.request_id,
            time_to_first_chunk=attempt.time_to_first_chunk,
            server_processing=attempt.server_processing,
            network_overhead=attempt.network_overhead,
            event_loop_lag=attempt.event_loop_lag,
            stream_events=attempt.stream_events,
            reused=attempt.reused,
            ratelimit=attempt.ratelimit,
            error=attempt.error,
            failed_phase=attempt.failed_phase,
            resend_count=attempt.resend_count,
        )


def to_results(spans: Iterable[ReadableSpan]) -> list[RequestResult]:
    """Request spans (and ``retry.backoff`` spans) with their phases, in start order."""
    records = sorted(from_readable_spans(spans), key=lambda s: s.start_ns)
    children: dict[str, list[SpanRecord]] = {}
    for record in records:
        if record.parent_id is not None:
            children.setdefault(record.parent_id, []).append(record)
    chosen = []
    for record in records:
        own = children.get(record.span_id, [])
        if record.name == semconv.BACKOFF_SPAN and record.kind == "INTERNAL":
            chosen.append((record, own, True))
        elif is_attempt(record, any(semconv.PHASE in c.attributes for c in own)):
            chosen.append((record, own, False))
    origin = chosen[0][0].start_ns if chosen else 0
    results = []
    for record, own, is_backoff in chosen:
        if not is_backoff:
            results.append(RequestResult.of(to_attempt(record, own), origin))
            continue
        backoff = to_backoff(record)
        results.append(
            RequestResult(
                url="",
                status=None,
                total=backoff.duration,
                phases={},
                timings=[],
                start=(backoff.start_ns - origin) / 1e9,
                kind="backoff",
                error=backoff.reason,
            )
        )
    return results


def summarize(results: Sequence[RequestResult]) -> dict[str, dict[str, float]]:
    """p50, p95 and max of each phase that happened, of the total, and of the first chunk."""
    requests = [r for r in results if r.kind == "request"]
    series: dict[str, list[float]] = {}
    for result in requests:
        for phase in PHASE_NAMES:
            if phase in result.phases:
                series.setdefault(phase, []).append(result.phases[phase])
        if result.time_to_first_chunk is not None:
            series.setdefault("first_chunk", []).append(result.time_to_first_chunk)
        series.setdefault("total", []).append(result.total)
    return {
        name: {
            "p50": percentile(values, 50),
            "p95": percentile(values, 95),
            "max": max(values),
            "count": float(len(values)),
        }
        for name, values in series.items()
    }
