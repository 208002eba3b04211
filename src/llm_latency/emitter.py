"""Turns finished Timelines into spans and metrics: the one place that knows OTel names.

An adapter calls :meth:`Emitter.start` when an attempt starts (the request span starts, and
``traceparent`` is injected), then :meth:`Emitter.finish` (or :meth:`Emitter.finish_failed`)
once, when it ends: the phase spans, the request span's attributes and the metrics are written
then, from the Timeline and the emitter's own :class:`AttemptRecord` of the attempt.

The emitter is a façade over the pieces that do each job:

- :class:`~llm_latency.request_start.RequestStart`: the request span's start (name, kind,
  attributes, links) and the ``traceparent`` injected;
- :class:`~llm_latency.in_flight.AttemptsInFlight` (``emitter.attempts``): the attempts in
  flight, and the one way each leaves them; the lag its event loop charged it;
- :mod:`~llm_latency.attribute_table`: the facts of an ended attempt named as attributes;
- :class:`~llm_latency.span_writer.SpanWriter`: the request span's end and the phase spans;
- :class:`~llm_latency.metrics.AttemptMetrics` (``emitter.metrics``) and
  :class:`~llm_latency.pools.PoolMetrics` (``emitter.pools``): the metrics;
- :class:`~llm_latency.call_spans.CallSpans` (``emitter.calls``): the spans of logical calls,
  to which each attempt's start and end are handed;
- :class:`~llm_latency.fault_log.FaultLog` (``emitter.faults``): a plugin fault, logged once;
- :class:`~llm_latency.tracer_handle.TracerHandle`: the tracer and meter in use.

:data:`active` is the emitter of the current instrumentation.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, MutableMapping, Sequence

from opentelemetry.metrics import Meter
from opentelemetry.trace import Span, Tracer

from llm_latency import headers
from llm_latency.attempt_record import AttemptRecord
from llm_latency.attribute_table import end_attributes, token_attributes_for
from llm_latency.call_spans import CallSpans
from llm_latency.calls import current_call
from llm_latency.event_loop import stop_all as stop_lag_monitors
from llm_latency.facts import LoopLag, read_facts
from llm_latency.fault_log import FaultLog
from llm_latency.genai_metrics import GenAIMetrics
from llm_latency.in_flight import AttemptsInFlight, charge_loop_lag
from llm_latency.metrics import AttemptMetrics
from llm_latency.observables import Observed, observed_on
from llm_latency.pools import PoolMetrics
from llm_latency.request_start import RequestStart
from llm_latency.semconv import GenAINames
from llm_latency.settings import Settings
from llm_latency.span_writer import SpanWriter
from llm_latency.timeline import Timeline
from llm_latency.tracer_handle import TracerHandle


class Emitter:
    """Starts request spans and, when an attempt ends, emits its phases, attributes and metrics."""

    def __init__(
        self,
        tracer: Tracer,
        meter: Meter | None,
        settings: Settings,
        *,
        before_first_request: Callable[[], None] | None = None,
        genai: GenAINames = GenAINames.OLD,
    ) -> None:
        self.phase_spans = settings.phase_spans
        #: Inject the trace context into each request (``instrument(propagate=...)``).
        self.propagate = settings.propagate
        #: Opt-in: keep each body chunk's interval for the time-per-output-chunk histogram.
        self.time_per_output_chunk = settings.time_per_output_chunk
        capture_headers = headers.resolve_capture_list(settings.capture_response_headers)
        #: The response headers captured as span attributes.
        self.captured_headers = frozenset(capture_headers)
        self._header_attrs = {name: headers.attribute_name(name) for name in capture_headers}
        #: The fault log of this instrumentation (a plugin fault, logged once).
        self.faults = FaultLog()
        self.metrics = AttemptMetrics(
            None, settings.phase_metrics, old_genai=genai is not GenAINames.LATEST
        )
        # The GenAI names (``OTEL_SEMCONV_STABILITY_OPT_IN``), decided here once: the default
        # runs the functions it always ran; the opt-in, the released names' as well.
        self._token_attributes = token_attributes_for(genai)
        #: The GenAI metrics under their released names (None without the opt-in).
        self.genai_metrics = None if genai is GenAINames.OLD else GenAIMetrics(None)
        if self.genai_metrics is not None:
            self._emit = self._emit_with_released_names  # type: ignore[method-assign]
        self._spans = SpanWriter(
            tracer,
            self.metrics,
            phase_spans=settings.phase_spans,
            fast_path=settings.phase_span_fast_path,
        )
        self._tracers = TracerHandle(
            tracer,
            before_first_request=before_first_request,
            report=self.faults.failed_once,
            on_change=self._spans.use_tracer,
            on_meter=self._use_meter if meter is None else None,
        )
        #: The spans of logical calls (the API the retry helper and the SDK adapters drive).
        self.calls = CallSpans(self._tracers, self.metrics)
        #: Attempts started and not yet ended: ended by finish_all() when the plugin is
        #: uninstrumented, since the hooks that would end them are gone then; forgotten when
        #: their event loop closed or went first (nothing can end them then).
        self.attempts = AttemptsInFlight(self.faults)
        self._starts = RequestStart(self._spans, propagate=settings.propagate)
        self.pools = PoolMetrics(None, self.in_flight, self.faults.failed_once)
        #: The observable instruments this instrumentation's tallies and pools are plugged into.
        self._observed: Observed | None = None
        if meter is not None:
            self._use_meter(meter)

    def _use_meter(self, meter: Meter) -> None:
        """Record into ``meter`` and report through its observable instruments (given to
        ``instrument()``, set globally before it, or settled at a request since: ``meter`` None
        at construction)."""
        self.metrics.use_meter(meter)
        if self.genai_metrics is not None:
            self.genai_metrics.use_meter(meter)
        self.pools.use_meter(meter)
        self._observed = observed_on(meter)
        self._observed.plug(self, {**self.metrics.observers(), **self.pools.observers()})

    @property
    def on_forget(self) -> list[Callable[[Collection[Timeline]], object]]:
        """Called with the attempts forgotten because their event loop closed or went before
        they ended: an adapter drops what it holds of them (the body stream it owns)."""
        return self.attempts.on_forget

    # -- start --------------------------------------------------------------------------------

    def start(
        self,
        timeline: Timeline,
        host: str,
        port: int | None,
        path: str,
        carrier: MutableMapping[str, str] | None = None,
        previous: Span | None = None,
        on_loop: bool = False,
    ) -> Span:
        """Start the attempt's request span and inject ``traceparent`` into ``carrier``.
        ``previous``, the request span of an earlier attempt of the same call (a redirect or a
        resend), is linked, so hops stay connected even without a parent span. ``on_loop``:
        the attempt runs on the running asyncio loop, whose lag is measured."""
        if self._tracers.pending:
            self._tracers.settle()  # the span writer follows the tracer it settles on
        call = current_call.get()
        resend_count = timeline.resend_count
        if call is not None:
            resend_count = self.calls.attempt_starts(call, timeline.epoch_start_ns, resend_count)
        record = self._starts.start(timeline, call, resend_count, (host, port, path), previous)
        if self.time_per_output_chunk:
            timeline.gaps = []
        self.attempts.add(record, on_loop)
        self._starts.inject(carrier, record)
        return record.span

    # -- finish -------------------------------------------------------------------------------

    def finish(self, timeline: Timeline, at: int | None = None) -> None:
        """End the attempt exactly once: phase spans, attributes, metrics. Never raises."""
        record = None
        try:
            if not timeline.close(at):
                return
            record = self.attempts.take(timeline)
            if record is not None:
                windows = timeline.windows()
                self._emit(record, charge_loop_lag(record, windows), windows)
        except Exception:  # never break the host program
            self.faults.failed_once("emitting an attempt")
            if record is not None:
                try:
                    charge_loop_lag(record, timeline.windows())
                    self._spans.end(record)
                    self._attempt_ends(record, None, None)
                except Exception:
                    pass  # already reported
        finally:
            # The exception's traceback holds the frames that hold this Timeline: with the
            # reference kept, a failed request would live until the next cyclic collection.
            timeline.error = None

    def finish_failed(self, timeline: Timeline, error: BaseException) -> None:
        """End the attempt with ``error``, the exception the program is about to see (it
        fails the phase it interrupted). Once, like :meth:`finish`; never raises."""
        if timeline.ended:
            return
        try:
            timeline.fail(error)
        except Exception:
            self.faults.failed_once("recording a failure")
        self.finish(timeline)

    def _attempt_ends(
        self, record: AttemptRecord, reason: str | None, retry_after: float | None
    ) -> None:
        call = record.call
        if call is not None:
            timeline = record.timeline
            end = timeline.to_epoch_ns(timeline.end_ns)
            self.calls.attempt_ends(call, end, reason, retry_after, record.host)

    def finish_all(self) -> None:
        """End every attempt still open, and stop watching the pools (at uninstrument: what
        happens next can no longer be seen)."""
        self.attempts.end_all(self.finish)
        self.pools.forget()
        if self._observed is not None:
            self._observed.unplug(self)
        stop_lag_monitors()

    def in_flight(self) -> list[AttemptRecord]:
        """The attempts started and not ended yet (read when the SDK collects, from another
        thread)."""
        return self.attempts.in_flight()

    def _emit(
        self,
        record: AttemptRecord,
        lag: LoopLag | None,
        windows: Sequence[tuple[int, int, int]],
    ) -> None:
        facts = read_facts(record.timeline, lag, self.captured_headers)
        record.facts = facts
        attributes = end_attributes(record, self._header_attrs)
        answer = None
        if facts.usage is not None or facts.time_to_first_token is not None:
            answer = self._token_attributes(record)
            attributes.update(answer)
            if record.call is not None:
                body = record.timeline.body
                record.call.answered(answer, body.first_token_ns if body is not None else 0)
        if facts.request_id is not None and record.call is not None:
            record.call.request_id = facts.request_id
        self._spans.write(record, attributes, windows)
        ctx = record.context
        self.metrics.record(record, facts, ctx)
        if answer is not None:
            self.metrics.answer(record.host, facts, answer, ctx)
        self._attempt_ends(record, facts.error_type, facts.retry_after)

    def _emit_with_released_names(
        self,
        record: AttemptRecord,
        lag: LoopLag | None,
        windows: Sequence[tuple[int, int, int]],
    ) -> None:
        """:meth:`_emit`, then the GenAI metrics under their released names (the opt-in)."""
        Emitter._emit(self, record, lag, windows)
        assert self.genai_metrics is not None
        self.genai_metrics.record(record, record.facts, record.context)

    def failed_once(self, what: str) -> None:
        """Log a fault inside the plugin, once per emitter (see :attr:`faults`)."""
        self.faults.failed_once(what)


#: The emitter of the current instrumentation (None when llm-latency is not instrumented): how
#: the retry helper and the tests reach it.
active: Emitter | None = None
