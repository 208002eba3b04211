"""Turns finished Timelines into spans and metrics: the one place that knows OTel names."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, MutableMapping
from contextvars import Token
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.context import Context
from opentelemetry.metrics import Meter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.util.http import sanitize_method

from llm_latency import headers, semconv
from llm_latency.calls import LogicalCall, current_call
from llm_latency.event_loop import monitor_of_running_loop
from llm_latency.event_loop import stop_all as stop_lag_monitors
from llm_latency.facts import AttemptFacts, error_type, read_facts
from llm_latency.metrics import AttemptMetrics
from llm_latency.phase_spans import PhaseSpanWriter
from llm_latency.pools import PoolMetrics
from llm_latency.setup import tracer_provider_is_set
from llm_latency.suppression import under_genai_span, under_http_client_span
from llm_latency.timeline import PHASE_NAMES, RECEIVE, SEND, WAIT, Timeline
from llm_latency.urls import redact, route_template
from llm_latency.version import __version__

_logger = logging.getLogger(__name__)

_CLIENT = SpanKind.CLIENT
_INTERNAL = SpanKind.INTERNAL


def _call_context(call: LogicalCall) -> Context | None:
    """Where a backoff between two attempts of ``call`` belongs: under the call's own span, or
    beside the attempts. An attempt starts under an HTTP client instrumentation's span for the
    same request: the backoff goes under that span's parent, not inside the next request."""
    if call.span is not None:
        return set_span_in_context(call.span)
    if not under_http_client_span():
        return None
    parent = getattr(get_current_span(), "parent", None)  # an SDK span's parent SpanContext
    if parent is None:
        return Context()  # a root: the request span had no parent either
    return set_span_in_context(NonRecordingSpan(parent))


class Emitter:
    """Starts request spans and, when an attempt ends, emits its phases, attributes and metrics."""

    def __init__(
        self,
        tracer: Tracer,
        meter: Meter,
        *,
        capture_headers: tuple[str, ...],
        phase_spans: bool = True,
        phase_span_fast_path: bool = True,
        before_first_request: Callable[[], None] | None = None,
    ) -> None:
        self._tracer = tracer
        # The API's proxy tracer follows a provider set later; once one is set, the real
        # tracer is taken, so that the fast path for phase spans applies.
        self._follows_global = isinstance(tracer, trace.ProxyTracer)
        self._before_first_request = before_first_request
        # Requests that start while another thread (or greenlet) runs the set-up wait for it,
        # or their spans would go to the API's no-op tracer. Reentrant: a request the set-up
        # itself makes goes on.
        self._setting_up = threading.RLock()
        self._setup_pending = before_first_request is not None
        self.phase_spans = phase_spans
        self._wanted = frozenset(capture_headers)
        self._header_attrs = {name: headers.attribute_name(name) for name in capture_headers}
        self._failure_logged = False
        self.metrics = AttemptMetrics(meter)
        self._fast_path = phase_span_fast_path
        self._phase_writer = PhaseSpanWriter(tracer, fast_path=phase_span_fast_path)
        # Attempts started and not yet ended: ended by finish_all() when the plugin is
        # uninstrumented, since the hooks that would end them are gone then.
        self._open: set[Timeline] = set()
        self.pools = PoolMetrics(meter, self._in_flight, self.failed_once)

    # -- start --------------------------------------------------------------------------------

    def start(
        self,
        timeline: Timeline,
        host: str,
        port: int | None,
        path: str,
        carrier: MutableMapping[str, str] | None = None,
        previous: Timeline | None = None,
        on_loop: bool = False,
    ) -> Span:
        """Start the attempt's request span, inject ``traceparent`` into ``carrier``, and keep
        the span on the timeline. ``previous``, an earlier attempt of the same call (a
        redirect or a resend), is linked, so hops stay connected even without a parent span.
        ``on_loop``: the attempt runs on the running asyncio loop, whose lag is measured."""
        if self._follows_global or self._setup_pending:
            self._settle_tracer()
        method = timeline.method
        timeline.host = host
        timeline.port = port
        call = current_call.get()
        if call is not None:
            self._attempt_starts(call, timeline)
        template = route_template(path)
        # Unknown methods are "_OTHER", unless OTEL_PYTHON_INSTRUMENTATION_HTTP_CAPTURE_ALL_METHODS
        # says to keep them; the metrics use the same form.
        known = sanitize_method(method) or "_OTHER"
        timeline.method = known
        attributes: dict[str, Any] = {
            semconv.HTTP_REQUEST_METHOD: known,
            semconv.URL_FULL: redact(timeline.url),
            semconv.SERVER_ADDRESS: host,
        }
        if known != method:
            attributes[semconv.HTTP_REQUEST_METHOD_ORIGINAL] = method
        if port is not None:
            attributes[semconv.SERVER_PORT] = port
        if template is not None:
            attributes[semconv.URL_TEMPLATE] = template
        name = (
            f"{known if known != '_OTHER' else 'HTTP'} {template}"
            if template
            else (known if known != "_OTHER" else "HTTP")
        )
        links = None
        if previous is not None and previous.span is not None:
            links = [Link(previous.span.get_span_context())]
        span = self._tracer.start_span(
            name,
            # Under an official HTTP client instrumentation's span for the same request, ours
            # is its detail: one CLIENT span per request.
            kind=_INTERNAL if under_http_client_span() else _CLIENT,
            attributes=attributes,
            links=links,
            start_time=timeline.epoch_start_ns,
        )
        timeline.span = span
        self._open.add(timeline)
        if on_loop:
            monitor = monitor_of_running_loop()
            if monitor is not None:
                monitor.attempt_started()
                timeline.loop_monitor = monitor
        if carrier is not None:
            propagate.inject(carrier, context=set_span_in_context(span))
        return span

    def _settle_tracer(self) -> None:
        if self._setup_pending:
            with self._setting_up:
                setup, self._before_first_request = self._before_first_request, None
                if setup is not None:
                    try:
                        setup()
                    except Exception:
                        self.failed_once("set-up at the first request")
                    finally:
                        self._setup_pending = False
        if self._follows_global and tracer_provider_is_set():
            self._follows_global = False
            self._tracer = trace.get_tracer(
                semconv.SCOPE_NAME, __version__, schema_url=semconv.SCHEMA_URL
            )
            self._phase_writer = PhaseSpanWriter(self._tracer, fast_path=self._fast_path)

    # -- logical calls and backoffs -----------------------------------------------------------

    def _attempt_starts(self, call: LogicalCall, timeline: Timeline) -> None:
        timeline.call = call
        timeline.resend_count, backoff = call.attempt_started(
            timeline.epoch_start_ns, timeline.resend_count
        )
        if backoff is not None:
            span = self.start_backoff(
                backoff.reason,
                backoff.retry_after,
                backoff.host,
                backoff.start_epoch_ns,
                _call_context(call),
            )
            span.end(backoff.end_epoch_ns)

    def start_backoff(
        self,
        reason: str | None,
        retry_after: float | None,
        host: str,
        start_epoch_ns: int | None = None,
        parent: Context | None = None,
    ) -> Span:
        """Start a ``retry.backoff`` span (the caller ends it) and count the retry. Its parent:
        ``parent``'s span, by default the current one."""
        attributes: dict[str, Any] = {semconv.BACKOFF_REASON: reason or "unknown"}
        if retry_after is not None:
            attributes[semconv.BACKOFF_RETRY_AFTER] = retry_after
        self.metrics.retry(host, reason)
        return self._tracer.start_span(
            semconv.BACKOFF_SPAN,
            context=parent,
            kind=_INTERNAL,
            attributes=attributes,
            start_time=start_epoch_ns,
        )

    def open_call(
        self,
        name: str,
        attributes: dict[str, Any],
        *,
        own_backoffs: bool = False,
        numbers_attempts: bool = False,
    ) -> LogicalCall:
        """A logical call with its own parent span, unless a GenAI span is already current:
        then that span is the parent, and none is added. ``own_backoffs``: the caller (the
        retry helper) emits the backoff spans itself; ``numbers_attempts``: the attempts'
        resend counts are their numbers in the call (an SDK that sends no retry count)."""
        if self._follows_global or self._setup_pending:
            # The set-up at the first request happens here when a call opens first, or the
            # first call's span would go to the API's no-op tracer.
            self._settle_tracer()
        span = None
        if not under_genai_span():
            span = self._tracer.start_span(name, kind=_INTERNAL, attributes=attributes)
        return LogicalCall(span, own_backoffs=own_backoffs, numbers_attempts=numbers_attempts)

    def enter_call(self, call: LogicalCall) -> Token[Context] | None:
        """Make ``call``'s span (if it has one) the current span, for its attempts and the
        program's own spans; :meth:`exit_call` with what this returns undoes it."""
        if call.span is None:
            return None
        return context.attach(set_span_in_context(call.span))

    @staticmethod
    def exit_call(attached: Token[Context] | None) -> None:
        """Undo :meth:`enter_call`."""
        if attached is not None:
            context.detach(attached)

    @staticmethod
    def end_backoff(span: Span, interrupted: BaseException | None = None) -> None:
        """The wait is over, or was cut short by ``interrupted`` (the span says so)."""
        if interrupted is not None:
            span.set_status(Status(StatusCode.ERROR, error_type(interrupted)))
            span.record_exception(interrupted)
        span.end()

    @staticmethod
    def abandon_call(call: LogicalCall) -> None:
        """End the call's span now, once, whatever its attempts do (a fault in the plugin)."""
        span = call.span
        if span is not None and span.is_recording():
            span.end()

    def close_call(
        self,
        call: LogicalCall,
        error: BaseException | None = None,
        *,
        returned_failure: bool = False,
    ) -> None:
        """The operation returned (or raised). Its span ends now, or when its last attempt
        (a stream still being read) ends. ``returned_failure``: when it returned with its
        latest attempt failed (an SDK that raises only above the hooked method: cohere's), the
        call failed for that reason."""
        span = call.span
        if span is not None and error is not None:
            span.set_status(Status(StatusCode.ERROR, error_type(error)))
            span.set_attribute(semconv.ERROR_TYPE, error_type(error))
            span.record_exception(error)
        elif span is not None and returned_failure and call.failed_last is not None:
            span.set_status(Status(StatusCode.ERROR, call.failed_last))
            span.set_attribute(semconv.ERROR_TYPE, call.failed_last)
        if call.returned():
            self._end_call(call)

    def _end_call(self, call: LogicalCall) -> None:
        span = call.span
        if span is not None and span.is_recording():
            span.set_attribute(semconv.ATTEMPTS, call.attempts)
            span.end()

    def _attempt_ends(
        self, timeline: Timeline, reason: str | None, retry_after: float | None
    ) -> None:
        call = timeline.call
        if call is None:
            return
        end = timeline.to_epoch_ns(timeline.end_ns)
        if call.attempt_ended(end, reason, retry_after, timeline.host):
            self._end_call(call)

    # -- finish -------------------------------------------------------------------------------

    def finish(self, timeline: Timeline, at: int | None = None) -> None:
        """End the attempt exactly once: phase spans, attributes, metrics. Never raises."""
        try:
            if not timeline.close(at):
                return
            self._open.discard(timeline)
            self._emit(timeline, self._loop_lag(timeline))
        except Exception:  # never break the host program
            self.failed_once("emitting an attempt")
            try:
                self._loop_lag(timeline)
                span = timeline.span
                if span is not None and span.is_recording():
                    span.end(timeline.to_epoch_ns(timeline.end_ns))
                self._attempt_ends(timeline, None, None)
            except Exception:
                pass  # already reported

    def finish_failed(self, timeline: Timeline, error: BaseException) -> None:
        """End the attempt with ``error``, the exception the program is about to see (it
        fails the phase it interrupted). Once, like :meth:`finish`; never raises."""
        if timeline.ended:
            return
        try:
            timeline.fail(error)
        except Exception:
            self.failed_once("recording a failure")
        self.finish(timeline)

    @staticmethod
    def _loop_lag(timeline: Timeline) -> tuple[float, float] | None:
        """How long the attempt's busy event loop delayed the end of its send and wait phases
        (the send-to-first-byte window), and of its receive phase (s); None for an attempt not
        on a loop. Once per attempt."""
        monitor = timeline.loop_monitor
        if monitor is None:
            return None
        timeline.loop_monitor = None
        in_send, in_wait, in_receive = monitor.attempt_ended(
            (timeline.bounds_of(SEND), timeline.bounds_of(WAIT), timeline.bounds_of(RECEIVE))
        )
        return (in_send + in_wait) / 1e9, in_receive / 1e9

    def finish_all(self) -> None:
        """End every attempt still open, and stop watching the pools (at uninstrument: what
        happens next can no longer be seen)."""
        for timeline in list(self._open):
            self.finish(timeline)
        self.pools.forget()
        stop_lag_monitors()

    def _in_flight(self) -> list[Timeline]:
        """The attempts in flight (read when the SDK collects, from another thread)."""
        for _ in range(3):
            try:
                return list(self._open)
            except RuntimeError:  # the set changed during the copy
                continue
        return []

    def _emit(self, timeline: Timeline, lag: tuple[float, float] | None) -> None:
        span: Span | None = timeline.span
        if span is None:
            return
        facts = read_facts(timeline, lag, self._wanted)
        span.set_attributes(self._attributes(timeline, facts))
        ctx = set_span_in_context(span)
        error = timeline.error
        self._emit_phases(timeline, span, ctx, timeline.host, error)
        if error is not None:
            if timeline.failed_phase is None or not self.phase_spans:
                span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{facts.error_type}"))
        elif facts.error_type is not None:
            span.set_status(Status(StatusCode.ERROR))
        span.end(timeline.to_epoch_ns(timeline.end_ns))
        self.metrics.record(timeline, facts, ctx)
        self._attempt_ends(timeline, facts.error_type, facts.retry_after)

    def _attributes(self, timeline: Timeline, facts: AttemptFacts) -> dict[str, Any]:
        """The request span's attributes known once the attempt has ended."""
        attributes: dict[str, Any] = {}
        for name, values in facts.headers.items():
            attributes[self._header_attrs[name]] = values
        if facts.status is not None:
            attributes[semconv.HTTP_RESPONSE_STATUS_CODE] = facts.status
        if timeline.protocol_version:
            attributes[semconv.NETWORK_PROTOCOL_VERSION] = timeline.protocol_version
        if timeline.reused is not None:
            attributes[semconv.CONNECTION_REUSED] = timeline.reused
        if timeline.resend_count:
            attributes[semconv.HTTP_REQUEST_RESEND_COUNT] = timeline.resend_count
        if facts.event_loop_lag is not None:
            attributes[semconv.EVENT_LOOP_LAG] = facts.event_loop_lag
        if facts.server_processing is not None:
            attributes[semconv.SERVER_PROCESSING_TIME] = facts.server_processing
        if facts.network_overhead is not None:
            attributes[semconv.NETWORK_OVERHEAD] = facts.network_overhead
        if facts.time_to_first_chunk is not None:
            attributes[semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = facts.time_to_first_chunk
            attributes[semconv.STREAM_EVENTS] = facts.stream_events
            attributes[semconv.STREAM_MAX_GAP] = facts.stream_max_gap
        if facts.failed_phase is not None:
            attributes[semconv.FAILED_PHASE] = facts.failed_phase
        if facts.error_type is not None:
            attributes[semconv.ERROR_TYPE] = facts.error_type
        return attributes

    def _emit_phases(
        self, timeline: Timeline, span: Span, ctx: Context, host: str, error: BaseException | None
    ) -> None:
        record = self.metrics.phase
        writer = self._phase_writer
        emit_spans = self.phase_spans and span.is_recording()
        fast_parent = writer.fast_path(span) if emit_spans else None
        failed = timeline.failed_phase if error is not None else None
        for phase in range(len(PHASE_NAMES)):
            bounds = timeline.bounds_of(phase)
            if bounds is None:
                continue
            start, end = bounds
            attributes = writer.attributes(phase, host)
            record(attributes, (end - start) / 1e9, ctx)
            if not emit_spans:
                continue
            if fast_parent is not None and phase != failed:
                writer.write(
                    phase,
                    attributes,
                    fast_parent,
                    timeline.to_epoch_ns(start),
                    timeline.to_epoch_ns(end),
                )
                continue
            child = writer.start(phase, attributes, ctx, timeline.to_epoch_ns(start))
            if error is not None and phase == failed:
                kind = error_type(error)
                child.set_attribute(semconv.ERROR_TYPE, kind)
                child.record_exception(error)
                child.set_status(Status(StatusCode.ERROR, kind))
            child.end(timeline.to_epoch_ns(end))

    def failed_once(self, what: str) -> None:
        """Log a fault inside the plugin, once per emitter."""
        if not self._failure_logged:
            self._failure_logged = True
            _logger.exception("llm-latency: internal error in %s (logged once)", what)
