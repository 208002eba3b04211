"""From exported spans to per-request results and percentiles: what the CLI shows.

The CLI measures with llm-latency itself: it instruments its own clients, collects the finished
spans in memory, and reads each request span and its phase children back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from llm_latency.diagnosis.findings import percentile
from llm_latency.diagnosis.records import (
    Attempt,
    SpanRecord,
    children_by_parent,
    from_readable_spans,
    is_attempt,
    is_backoff,
    is_success,
    to_attempt,
    to_backoff,
)
from llm_latency.timeline import PHASE_NAMES

#: The number of the request being sent (1, 2, ...), set by the code that sends it: a span
#: started under it belongs to that request.
REQUEST_NUMBER: ContextVar[int | None] = ContextVar("llm_latency_request_number", default=None)

#: Told about each finished span, with the number of the request it belongs to (or None).
Listener = Callable[[ReadableSpan, "int | None"], None]


class SpanCollector(SpanProcessor):
    """Keeps every finished span in memory, and tells ``listener`` (when set) about each as it
    ends. Once :meth:`freeze` is called, spans that end are dropped."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []
        #: What the last ``take()`` returned: the CLI diagnoses the spans ``probe_url`` read.
        self.taken: list[ReadableSpan] = []
        self.listener: Listener | None = None
        self._numbers: dict[int, int] = {}
        self._frozen = False
        self._lock = threading.Lock()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Note which request (``REQUEST_NUMBER``) the span belongs to."""
        number = REQUEST_NUMBER.get()
        if number is not None:
            with self._lock:
                self._numbers[span.context.span_id] = number

    def on_end(self, span: ReadableSpan) -> None:
        """Keep the finished span and tell the listener."""
        span_id = span.context.span_id if span.context is not None else 0
        with self._lock:
            number = self._numbers.pop(span_id, None)
            if self._frozen:
                return
            self.spans.append(span)
            listener = self.listener
        if listener is not None:
            listener(span, number)

    def freeze(self) -> None:
        """Keep no span that ends from now on (the run was stopped: they did not finish)."""
        with self._lock:
            self._frozen = True

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
    stream_mean_interval: float | None = None
    stream_chunk_rate: float | None = None
    reused: bool | None = None
    ratelimit: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    failed_phase: str | None = None
    resend_count: int = 0
    kind: str = "request"
    number: int | None = None
    #: The answer's tokens as the server counted them, and the model it named.
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    time_to_first_token: float | None = None
    time_per_output_token: float | None = None
    #: A stream with content and no usage (no ``include_usage``).
    usage_unknown: bool = False

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
            stream_mean_interval=attempt.stream_mean_interval,
            stream_chunk_rate=attempt.stream_chunk_rate,
            reused=attempt.reused,
            ratelimit=attempt.ratelimit,
            error=attempt.error,
            failed_phase=attempt.failed_phase,
            resend_count=attempt.resend_count,
            model=attempt.model,
            input_tokens=attempt.input_tokens,
            output_tokens=attempt.output_tokens,
            time_to_first_token=attempt.time_to_first_token,
            time_per_output_token=attempt.time_per_output_token,
            usage_unknown=attempt.usage_unknown,
        )


def result_of(
    span: SpanRecord, children: Sequence[SpanRecord], origin_ns: int
) -> RequestResult | None:
    """The result of a request span and its phase ``children``; None for any other span."""
    if not is_attempt(span, children):
        return None
    return RequestResult.of(to_attempt(span, children), origin_ns)


def to_results(spans: Iterable[ReadableSpan]) -> list[RequestResult]:
    """Request spans (and ``retry.backoff`` spans) with their phases, in start order."""
    records = sorted(from_readable_spans(spans), key=lambda s: s.start_ns)
    children = children_by_parent(records)
    chosen = [
        record
        for record in records
        if is_backoff(record) or is_attempt(record, children.get(record.span_id, []))
    ]
    origin = chosen[0].start_ns if chosen else 0
    results = []
    for record in chosen:
        if not is_backoff(record):
            attempt = to_attempt(record, children.get(record.span_id, []))
            results.append(RequestResult.of(attempt, origin))
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


#: The status classes of :func:`summarize_by_status`, in the order they are shown.
STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx", "failed")


def status_class(result: RequestResult) -> str:
    """``2xx``, ``3xx``, ``4xx``, ``5xx`` (by the response's status), or ``failed``: no
    response, or one that broke off (an error after the headers, e.g. a timeout mid-stream)."""
    if result.error is not None or result.status is None:
        return "failed"
    return f"{result.status // 100}xx"


def succeeded(result: RequestResult) -> bool:
    """A whole response with a status below 400 (:func:`is_success` of the records)."""
    return is_success(result.status, result.error)


def summarize(results: Sequence[RequestResult]) -> dict[str, dict[str, float]]:
    """p50, p95, max and count of each phase that happened, of the total, and of the first
    chunk, over the requests that succeeded (:func:`succeeded`): a 429 answered at once or a
    request that failed would pull the percentiles down. See :func:`summarize_by_status`."""
    return _percentiles([r for r in results if r.kind == "request" and succeeded(r)])


@dataclass
class StatusSummary:
    """The requests of one status class: how many, per status code (``failed``: per error),
    and their percentiles (as :func:`summarize`)."""

    requests: int
    statuses: dict[str, int]
    phases: dict[str, dict[str, float]]

    def detail(self) -> str:
        """``200: 3, 201: 1``: the counts, most frequent first."""
        ordered = sorted(self.statuses.items(), key=lambda kv: (-kv[1], kv[0]))
        return ", ".join(f"{name}: {count}" for name, count in ordered)

    def as_json(self) -> dict[str, Any]:
        """``{"requests": N, "statuses": {code or error: N}, "phases": {phase: {p50, p95,
        max}}}``."""
        return {
            "requests": self.requests,
            "statuses": dict(self.statuses),
            "phases": {
                name: {q: row[q] for q in ("p50", "p95", "max")}
                for name, row in self.phases.items()
            },
        }


def summarize_by_status(results: Sequence[RequestResult]) -> dict[str, StatusSummary]:
    """The requests per status class (:func:`status_class`), in :data:`STATUS_CLASSES` order;
    a failed request counts under its error and the phase it failed in (``TimeoutError in
    receive``)."""
    groups: dict[str, list[RequestResult]] = {}
    for result in results:
        if result.kind == "request":
            groups.setdefault(status_class(result), []).append(result)
    summaries = {}
    for name in STATUS_CLASSES:
        members = groups.get(name)
        if not members:
            continue
        counts: dict[str, int] = {}
        for result in members:
            key = str(result.status)
            if name == "failed":
                key = result.error or "no response"
                key += f" in {result.failed_phase}" if result.failed_phase else ""
            counts[key] = counts.get(key, 0) + 1
        summaries[name] = StatusSummary(len(members), counts, _percentiles(members))
    return summaries


def _percentiles(requests: Sequence[RequestResult]) -> dict[str, dict[str, float]]:
    series: dict[str, list[float]] = {}
    for result in requests:
        for phase in PHASE_NAMES:
            if phase in result.phases:
                series.setdefault(phase, []).append(result.phases[phase])
        if result.time_to_first_chunk is not None:
            series.setdefault("first_chunk", []).append(result.time_to_first_chunk)
        if result.time_to_first_token is not None:
            series.setdefault("first_token", []).append(result.time_to_first_token)
        if result.time_per_output_token is not None:
            series.setdefault("per_output_token", []).append(result.time_per_output_token)
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
