"""Turns finished Timelines into spans and metrics: the one place that knows OTel names."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, MutableMapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.metrics import Meter
from opentelemetry.trace import (
    Link,
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    get_current_span,
    set_span_in_context,
)

from llm_latency import headers as hdr
from llm_latency import semconv as sc
from llm_latency.calls import LogicalCall, current_call
from llm_latency.event_loop import monitor_of_running_loop
from llm_latency.event_loop import stop_all as stop_lag_monitors
from llm_latency.metrics import AttemptMetrics
from llm_latency.phase_spans import PhaseSpanWriter
from llm_latency.pools import PoolMetrics
from llm_latency.setup import tracer_provider_is_set
from llm_latency.suppression import under_http_client_span
from llm_latency.timeline import PHASE_NAMES, RECEIVE, SEND, WAIT, Timeline
from llm_latency.urls import redact, route_template
from llm_latency.version import __version__

_logger = logging.getLogger(__name__)

_CLIENT = SpanKind.CLIENT
_INTERNAL = SpanKind.INTERNAL


def send_to_first_byte(tl: Timeline) -> float | None:
    """Seconds from the start of sending the request to its first response byte: the window
    that holds the server's whole processing time (the server may start as soon as the request's
    start reaches it, while the body is still being sent)."""
    send, wait = tl.span_of(SEND), tl.span_of(WAIT)
    if send is None or wait is None:
        return None
    return (wait[1] - send[0]) / 1e9


def error_type(error: BaseException) -> str:
    """``error.type`` for an exception: its class name, as the contrib instrumentations use."""
    return type(error).__qualname__


class Emitter:
    """Starts request spans and, when an attempt ends, emits its phases, attributes and metrics."""

    def __init__(
        self,
        tracer: Tracer,
        meter: Meter,
        *,
        capture_headers: tuple[str, ...],
        phase_spans: bool = True,
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
        self._header_attrs = {name: hdr.attribute_name(name) for name in capture_headers}
        self._failure_logged = False
        self.metrics = AttemptMetrics(meter)
        self._phase_writer = PhaseSpanWriter(tracer)
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
        known = method if method in sc.KNOWN_METHODS else "_OTHER"
        attributes: dict[str, Any] = {
            sc.HTTP_REQUEST_METHOD: known,
            sc.URL_FULL: redact(timeline.url),
            sc.SERVER_ADDRESS: host,
        }
        if known != method:
            attributes[sc.HTTP_REQUEST_METHOD_ORIGINAL] = method
        if port is not None:
            attributes[sc.SERVER_PORT] = port
        if template is not None:
            attributes[sc.URL_TEMPLATE] = template
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
            self._tracer = trace.get_tracer(sc.SCOPE_NAME, __version__, schema_url=sc.SCHEMA_URL)
            self._phase_writer = PhaseSpanWriter(self._tracer)

    # -- logical calls and backoffs -----------------------------------------------------------

    def _attempt_starts(self, call: LogicalCall, timeline: Timeline) -> None:
        timeline.call = call
        if call.helper_attempt > timeline.resend_count:
            timeline.resend_count = call.helper_attempt
        if call.last_reason is not None and call.last_end_epoch_ns and not call.own_backoffs:
            # The wait between the previous, failed attempt of this call and this one (after a
            # success, as after a redirect, the next attempt is no retry).
            backoff = self.start_backoff(
                call.last_reason, call.last_retry_after, call.last_host, call.last_end_epoch_ns
            )
            backoff.end(max(timeline.epoch_start_ns, call.last_end_epoch_ns))
        call.attempts += 1
        call.open_attempts += 1

    def start_backoff(
        self,
        reason: str | None,
        retry_after: float | None,
        host: str,
        start_epoch_ns: int | None = None,
    ) -> Span:
        """Start a ``retry.backoff`` span (the caller ends it) and count the retry."""
        attributes: dict[str, Any] = {sc.BACKOFF_REASON: reason or "unknown"}
        if retry_after is not None:
            attributes[sc.BACKOFF_RETRY_AFTER] = retry_after
        self.metrics.retry(host, reason)
        return self._tracer.start_span(
            sc.BACKOFF_SPAN, kind=_INTERNAL, attributes=attributes, start_time=start_epoch_ns
        )

    def open_call(self, name: str, attributes: dict[str, Any]) -> LogicalCall:
        """A logical call with its own parent span, unless a GenAI span is already current:
        then that span is the parent, and none is added."""
        if self._follows_global or self._setup_pending:
            # The set-up at the first request happens here when a call opens first, or the
            # first call's span would go to the API's no-op tracer.
            self._settle_tracer()
        current = get_current_span()
        current_attributes = getattr(current, "attributes", None) or {}
        if current.is_recording() and any(key.startswith("gen_ai.") for key in current_attributes):
            return LogicalCall()
        return LogicalCall(self._tracer.start_span(name, kind=_INTERNAL, attributes=attributes))

    def close_call(self, call: LogicalCall, error: BaseException | None = None) -> None:
        """The operation returned (or raised). Its span ends now, or when its last attempt
        (a stream still being read) ends."""
        call.returned = True
        span = call.span
        if span is None:
            return
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error_type(error)))
            span.set_attribute(sc.ERROR_TYPE, error_type(error))
            span.record_exception(error)
        if call.open_attempts <= 0:
            self._end_call(call)

    def _end_call(self, call: LogicalCall) -> None:
        span = call.span
        if span is not None and span.is_recording():
            span.set_attribute(sc.ATTEMPTS, call.attempts)
            span.end()

    def _attempt_ends(self, tl: Timeline, reason: str | None, found: dict[str, list[str]]) -> None:
        call: LogicalCall = tl.call
        call.open_attempts -= 1
        call.last_end_epoch_ns = tl.to_epoch_ns(tl.end_ns)
        call.last_reason = reason
        call.last_host = tl.host
        call.last_retry_after = hdr.retry_after(
            hdr.first(found, "retry-after-ms"), hdr.first(found, "retry-after")
        )
        if call.returned and call.open_attempts <= 0:
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
                if timeline.call is not None:
                    self._attempt_ends(timeline, None, {})
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
    def _loop_lag(tl: Timeline) -> tuple[float, float] | None:
        """How long the attempt's busy event loop delayed the end of its wait phase and of its
        receive phase (s); None for an attempt not on a loop. Once per attempt."""
        monitor = tl.loop_monitor
        if monitor is None:
            return None
        tl.loop_monitor = None
        in_wait, in_receive = monitor.attempt_ended((tl.span_of(WAIT), tl.span_of(RECEIVE)))
        return in_wait / 1e9, in_receive / 1e9

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

    def _emit(self, tl: Timeline, lag: tuple[float, float] | None) -> None:
        span: Span | None = tl.span
        if span is None:
            return
        attrs: dict[str, Any] = {}
        found: dict[str, list[str]] = {}
        if tl.response_headers is not None and self._wanted:
            found = hdr.select(tl.response_headers, self._wanted)
            for name, values in found.items():
                attrs[self._header_attrs[name]] = values
        status = tl.status_code
        if status is not None:
            attrs[sc.HTTP_RESPONSE_STATUS_CODE] = status
        if tl.protocol_version:
            attrs[sc.NETWORK_PROTOCOL_VERSION] = tl.protocol_version
        if tl.reused is not None:
            attrs[sc.CONNECTION_REUSED] = tl.reused
        if tl.resend_count:
            attrs[sc.HTTP_REQUEST_RESEND_COUNT] = tl.resend_count

        processing = hdr.parse_number(hdr.first(found, hdr.PROCESSING_MS_HEADER))
        window = send_to_first_byte(tl)
        lag_total: float | None = None
        wait_lag = 0.0
        if lag is not None:
            wait_lag, receive_lag = lag
            if processing is not None and window is not None:
                # The response cannot have come before the server's processing was done: the
                # loop delayed it by no more than what the processing time leaves of the wait.
                wait_lag = min(wait_lag, max(window - processing / 1000.0, 0.0))
            lag_total = wait_lag + receive_lag
            attrs[sc.EVENT_LOOP_LAG] = lag_total
        if processing is not None:
            processing /= 1000.0
            attrs[sc.SERVER_PROCESSING_TIME] = processing
            if window is not None:
                attrs[sc.NETWORK_OVERHEAD] = window - processing - wait_lag

        ttfc: float | None = None
        if tl.sse is not None and tl.first_chunk_ns:
            ttfc = (tl.first_chunk_ns - tl.start_ns) / 1e9
            attrs[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = ttfc
            attrs[sc.STREAM_EVENTS] = tl.sse.events
            attrs[sc.STREAM_MAX_GAP] = tl.max_gap_ns / 1e9

        error = tl.error
        err_type: str | None = None
        if error is not None:
            err_type = error_type(error)
            if tl.failed_phase is not None:
                attrs[sc.FAILED_PHASE] = PHASE_NAMES[tl.failed_phase]
        elif status is not None and status >= 400:
            err_type = str(status)
        if err_type is not None:
            attrs[sc.ERROR_TYPE] = err_type
        span.set_attributes(attrs)

        host = tl.host
        ctx = set_span_in_context(span)
        self._emit_phases(tl, span, ctx, host, error)

        if error is not None:
            if tl.failed_phase is None or not self.phase_spans:
                span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{err_type}"))
        elif err_type is not None:
            span.set_status(Status(StatusCode.ERROR))
        span.end(tl.to_epoch_ns(tl.end_ns))

        self._record_metrics(tl, ctx, found, status, err_type, ttfc, processing, lag_total)
        if tl.call is not None:
            self._attempt_ends(tl, err_type, found)

    def _emit_phases(
        self, tl: Timeline, span: Span, ctx: Context, host: str, error: BaseException | None
    ) -> None:
        record = self.metrics.phase
        writer = self._phase_writer
        emit_spans = self.phase_spans and span.is_recording()
        fast_parent = writer.fast_path(span) if emit_spans else None
        failed = tl.failed_phase if error is not None else None
        for phase in range(len(PHASE_NAMES)):
            bounds = tl.span_of(phase)
            if bounds is None:
                continue
            start, end = bounds
            attributes = writer.attributes(phase, host)
            record(attributes, (end - start) / 1e9, ctx)
            if not emit_spans:
                continue
            if fast_parent is not None and phase != failed:
                writer.write(
                    phase, attributes, fast_parent, tl.to_epoch_ns(start), tl.to_epoch_ns(end)
                )
                continue
            child = writer.start(phase, attributes, ctx, tl.to_epoch_ns(start))
            if error is not None and phase == failed:
                kind = error_type(error)
                child.set_attribute(sc.ERROR_TYPE, kind)
                child.record_exception(error)
                child.set_status(Status(StatusCode.ERROR, kind))
            child.end(tl.to_epoch_ns(end))

    def _record_metrics(
        self,
        tl: Timeline,
        ctx: Context,
        found: dict[str, list[str]],
        status: int | None,
        err_type: str | None,
        ttfc: float | None,
        processing: float | None,
        lag: float | None,
    ) -> None:
        host = tl.host
        method = tl.method
        attributes: dict[str, Any] = {
            sc.HTTP_REQUEST_METHOD: method if method in sc.KNOWN_METHODS else "_OTHER",
            sc.SERVER_ADDRESS: host,
        }
        if tl.port is not None:
            attributes[sc.SERVER_PORT] = tl.port
        if status is not None:
            attributes[sc.HTTP_RESPONSE_STATUS_CODE] = status
        if err_type is not None:
            attributes[sc.ERROR_TYPE] = err_type
        metrics = self.metrics
        metrics.attempt(tl.duration, attributes, host, status, tl.reused, ttfc, processing, ctx)
        if lag is not None:
            metrics.event_loop_lag.record(lag, {sc.SERVER_ADDRESS: host}, ctx)
        for header, kind in hdr.RATELIMIT_REMAINING_HEADERS.items():
            remaining = hdr.parse_number(hdr.first(found, header))
            if remaining is not None:
                reset_in = hdr.parse_duration(hdr.first(found, hdr.RATELIMIT_RESET_HEADERS[kind]))
                metrics.ratelimit(host, kind, remaining, reset_in)

    def failed_once(self, what: str) -> None:
        """Log a fault inside the plugin, once per emitter."""
        if not self._failure_logged:
            self._failure_logged = True
            _logger.exception("llm-latency: internal error in %s (logged once)", what)
