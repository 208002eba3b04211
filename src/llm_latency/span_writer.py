"""Writing an ended attempt's spans: the request span's end attributes, status, exception and
end, and a span per phase under it.

Phase spans are written cheaply where the SDK allows it (the direct path of
:class:`~llm_latency.phase_spans.PhaseSpanWriter`); each phase's duration is recorded in the same
pass over the phases (``llm_latency.phase.duration``, for the phases
``instrument(phase_metrics=...)`` chose), since the span and the measurement share their
attributes. The exception of a failed attempt goes on
the span of the phase it failed, or on the request span when no phase span carries it; its text
is scrubbed of any URL's credentials first (:func:`record_exception`).
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from llm_latency import semconv
from llm_latency.attempt_record import AttemptRecord
from llm_latency.facts import error_type
from llm_latency.metrics import AttemptMetrics
from llm_latency.phase_spans import PhaseSpanWriter
from llm_latency.timeline import QUEUE, RECEIVE, Timeline
from llm_latency.urls import scrub_userinfo


class SpanWriter:
    """Writes the spans of an instrumentation's ended attempts, through the writer of the
    tracer in use (:attr:`phases`, which also starts the request spans)."""

    def __init__(
        self, tracer: Tracer, metrics: AttemptMetrics, *, phase_spans: bool, fast_path: bool
    ) -> None:
        #: Write a span per phase (``instrument(phase_spans=...)``).
        self.phase_spans = phase_spans
        self._fast_path = fast_path
        self._metrics = metrics
        #: The phase span writer of the tracer in use.
        self.phases = PhaseSpanWriter(tracer, fast_path=fast_path)

    def use_tracer(self, tracer: Tracer) -> None:
        """Write through ``tracer`` from now on (the tracer handle settled on it)."""
        self.phases = PhaseSpanWriter(tracer, fast_path=self._fast_path)

    def write(
        self,
        record: AttemptRecord,
        attributes: dict[str, Any],
        windows: Sequence[tuple[int, int, int]],
    ) -> None:
        """Write the ended attempt's spans (``record.facts`` set): ``attributes`` on its request
        span, its phase spans, the error if it failed, and the request span's end."""
        timeline, span, facts = record.timeline, record.span, record.facts
        self.phases.set_attributes(span, attributes)
        error = timeline.error
        self._phases(
            timeline,
            windows,
            span,
            record.context,
            record.host,
            error,
            facts.phase_lags,
            facts.phase_waits,
        )
        if error is not None:
            if timeline.failed_phase is None or not self.phase_spans:
                record_exception(span, error)
            span.set_status(Status(StatusCode.ERROR, f"{facts.error_type}"))
        elif facts.error_type is not None:
            span.set_status(Status(StatusCode.ERROR))
        if facts.queue_time is not None or timeline.stream is not None:
            add_events(span, timeline)
        span.end(timeline.to_epoch_ns(timeline.end_ns))

    @staticmethod
    def end(record: AttemptRecord) -> None:
        """End the request span as it is, if it is not ended (its writing failed half-way)."""
        timeline, span = record.timeline, record.span
        if span.is_recording():
            span.end(timeline.to_epoch_ns(timeline.end_ns))

    def _phases(
        self,
        timeline: Timeline,
        windows: Sequence[tuple[int, int, int]],
        span: Span,
        ctx: Context,
        host: str,
        error: BaseException | None,
        lags: list[float] | None,
        waits: list[float] | None,
    ) -> None:
        # One pass, inlined: this loop runs per phase of every attempt. ``waits`` is None
        # unless the loop's thread waited for a CPU: one check per phase on the usual path.
        record = self._metrics.phase
        recorded = self._metrics.phases_recorded
        writer = self.phases
        emit_spans = self.phase_spans and span.is_recording()
        fast_parent = writer.fast_path(span) if emit_spans else None
        failed = timeline.failed_phase if error is not None else None
        to_epoch = timeline.epoch_start_ns - timeline.start_ns
        for phase, start, end in windows:
            attributes = writer.attributes(phase, host)
            if phase in recorded:
                record(attributes, (end - start) / 1e9, ctx)
            if not emit_spans:
                continue
            if lags is not None and lags[phase] > 0:
                # On the span only: the metric keeps the shared, low-cardinality attributes.
                attributes = {**attributes, semconv.EVENT_LOOP_LAG: lags[phase]}
            if waits is not None and waits[phase] > 0:
                attributes = {**attributes, semconv.EVENT_LOOP_DESCHEDULED: waits[phase]}
            if fast_parent is not None and phase != failed:
                writer.write(phase, attributes, fast_parent, start + to_epoch, end + to_epoch)
                continue
            child = writer.start(phase, attributes, ctx, start + to_epoch)
            if error is not None and phase == failed:
                kind = error_type(error)
                child.set_attribute(semconv.ERROR_TYPE, kind)
                record_exception(child, error)
                child.set_status(Status(StatusCode.ERROR, kind))
            child.end(end + to_epoch)


def add_events(span: Span, timeline: Timeline) -> None:
    """The request span's events, each an instant a collapsed trace view cannot show otherwise
    (Jaeger draws it as a tick on the span's bar): where an attempt that queued got its
    connection; on a streamed answer, its first response byte, first body chunk and first
    generated token, each only when it came later than the one before it."""
    to_epoch = timeline.epoch_start_ns - timeline.start_ns
    queue = timeline.bounds_of(QUEUE)
    if queue is not None:
        span.add_event(semconv.EVENT_CONNECTION_ACQUIRED, timestamp=queue[1] + to_epoch)
    receive = timeline.bounds_of(RECEIVE)
    if timeline.stream is None or receive is None:
        return
    last = receive[0]
    span.add_event(semconv.EVENT_FIRST_BYTE, timestamp=last + to_epoch)
    body = timeline.body
    for name, at in (
        (semconv.EVENT_FIRST_CHUNK, timeline.first_chunk_ns),
        (semconv.EVENT_FIRST_TOKEN, body.first_token_ns if body is not None else 0),
    ):
        if at > last:
            span.add_event(name, timestamp=at + to_epoch)
            last = at


def record_exception(span: Span, error: BaseException) -> None:
    """Record ``error`` on ``span``, with the credentials of any URL its text quotes redacted."""
    stack = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    if "@" not in stack:
        span.record_exception(error)
        return
    span.record_exception(
        error,
        attributes={
            "exception.message": scrub_userinfo(str(error)),
            "exception.stacktrace": scrub_userinfo(stack),
        },
    )
