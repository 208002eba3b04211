"""From exported spans to per-request results and percentiles: what the CLI shows.

The CLI measures with llm-latency itself: it instruments its own clients, collects the finished
spans in memory, and reads each request span and its phase children back.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanKind

from llm_latency.timeline import PHASE_NAMES

RATELIMIT_HEADERS = (
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-requests",
    "retry-after-ms",
)


class SpanCollector(SpanProcessor):
    """Keeps every finished span in memory."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []
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


def _first(value: Any) -> str | None:
    if isinstance(value, (tuple, list)):
        return str(value[0]) if value else None
    return None if value is None else str(value)


def to_results(spans: Iterable[ReadableSpan]) -> list[RequestResult]:
    """Request spans (and ``retry.backoff`` spans) with their phases, in start order."""
    spans = list(spans)
    children: dict[int, list[ReadableSpan]] = {}
    for span in spans:
        if span.parent is not None:
            children.setdefault(span.parent.span_id, []).append(span)
    chosen = [s for s in spans if s.kind is SpanKind.CLIENT or s.name == "retry.backoff"]
    chosen.sort(key=lambda s: s.start_time or 0)
    origin = chosen[0].start_time or 0 if chosen else 0
    results = []
    for span in chosen:
        attrs = dict(span.attributes or {})
        start, end = span.start_time or 0, span.end_time or 0
        if span.name == "retry.backoff":
            results.append(
                RequestResult(
                    url="",
                    status=None,
                    total=(end - start) / 1e9,
                    phases={},
                    timings=[],
                    start=(start - origin) / 1e9,
                    kind="backoff",
                    error=str(attrs.get("llm_latency.backoff.reason")),
                )
            )
            continue
        assert span.context is not None
        timings = []
        phases: dict[str, float] = {}
        for child in children.get(span.context.span_id, []):
            phase = str((child.attributes or {}).get("llm_latency.phase", ""))
            if phase not in PHASE_NAMES:
                continue
            c_start, c_end = child.start_time or 0, child.end_time or 0
            phases[phase] = (c_end - c_start) / 1e9
            timings.append(PhaseTiming(phase, (c_start - start) / 1e9, (c_end - c_start) / 1e9))
        timings.sort(key=lambda t: PHASE_NAMES.index(t.name))
        ratelimit = {
            name: value
            for name in RATELIMIT_HEADERS
            if (value := _first(attrs.get(f"http.response.header.{name}"))) is not None
        }
        status = attrs.get("http.response.status_code")
        error = attrs.get("error.type")
        results.append(
            RequestResult(
                url=str(attrs.get("url.full", "")),
                status=int(status) if isinstance(status, int) else None,
                total=(end - start) / 1e9,
                phases=phases,
                timings=timings,
                start=(start - origin) / 1e9,
                request_id=_first(attrs.get("http.response.header.x-request-id"))
                or _first(attrs.get("http.response.header.request-id")),
                time_to_first_chunk=_float(attrs.get("gen_ai.response.time_to_first_chunk")),
                server_processing=_float(attrs.get("llm_latency.server.processing_time")),
                network_overhead=_float(attrs.get("llm_latency.network_overhead")),
                stream_events=_int(attrs.get("llm_latency.stream.events")),
                reused=attrs.get("llm_latency.connection.reused")  # type: ignore[arg-type]
                if isinstance(attrs.get("llm_latency.connection.reused"), bool)
                else None,
                ratelimit=ratelimit,
                error=None if error is None or str(error).isdigit() else str(error),
                failed_phase=_str(attrs.get("llm_latency.failed_phase")),
                resend_count=_int(attrs.get("http.request.resend_count")) or 0,
            )
        )
    return results


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) else None


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, by linear interpolation."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


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
