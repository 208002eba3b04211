"""The spans of logical calls: one parent span per operation, a ``retry.backoff`` span per wait.

This is the API the retry helper (``llm_latency.retry``) and the SDK adapters
(``adapters.sdks``, ``adapters.litellm``) drive: open a call, make its span current, close it
when the operation returns. The emitter tells it when each attempt of a call starts and ends
(:meth:`CallSpans.attempt_starts`, :meth:`CallSpans.attempt_ends`); the bookkeeping itself is
:class:`~llm_latency.calls.LogicalCall`'s.
"""

from __future__ import annotations

from contextvars import Token
from typing import Any

from opentelemetry import context
from opentelemetry.context import Context
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanKind,
    Status,
    StatusCode,
    get_current_span,
    set_span_in_context,
)

from llm_latency import semconv
from llm_latency.calls import LogicalCall
from llm_latency.facts import error_type
from llm_latency.metrics import AttemptMetrics
from llm_latency.suppression import under_genai_span, under_http_client_span
from llm_latency.tracer_handle import TracerHandle

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


class CallSpans:
    """Opens and ends the spans of logical calls and of the waits between their attempts."""

    def __init__(self, tracers: TracerHandle, metrics: AttemptMetrics) -> None:
        self._tracers = tracers
        self._metrics = metrics

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
        tracers = self._tracers
        # The set-up at the first request happens here when a call opens first, or the first
        # call's span would go to the API's no-op tracer.
        tracer = tracers.settle() if tracers.pending else tracers.tracer
        span = None
        if not under_genai_span():
            span = tracer.start_span(name, kind=_INTERNAL, attributes=attributes)
        return LogicalCall(span, own_backoffs=own_backoffs, numbers_attempts=numbers_attempts)

    @staticmethod
    def enter_call(call: LogicalCall) -> Token[Context] | None:
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
        self._metrics.retry(host, reason)
        return self._tracers.tracer.start_span(
            semconv.BACKOFF_SPAN,
            context=parent,
            kind=_INTERNAL,
            attributes=attributes,
            start_time=start_epoch_ns,
        )

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
            _end_call(call)

    # -- the attempts of a call (the emitter reports them) ------------------------------------

    def attempt_starts(self, call: LogicalCall, start_epoch_ns: int, resend_count: int) -> int:
        """An attempt of ``call`` starts (the client counts ``resend_count`` retries): emit
        the wait since the previous one, if it failed. Returns the attempt's resend count."""
        resend_count, backoff = call.attempt_started(start_epoch_ns, resend_count)
        if backoff is not None:
            span = self.start_backoff(
                backoff.reason,
                backoff.retry_after,
                backoff.host,
                backoff.start_epoch_ns,
                _call_context(call),
            )
            span.end(backoff.end_epoch_ns)
        return resend_count

    @staticmethod
    def attempt_ends(
        call: LogicalCall,
        end_epoch_ns: int,
        reason: str | None,
        retry_after: float | None,
        host: str,
    ) -> None:
        """An attempt of ``call`` ended (``reason``: why it failed, None for a success): the
        call's span ends too when the operation has returned and nothing else is open."""
        if call.attempt_ended(end_epoch_ns, reason, retry_after, host):
            _end_call(call)


def _end_call(call: LogicalCall) -> None:
    span = call.span
    if span is not None and span.is_recording():
        span.set_attribute(semconv.ATTEMPTS, call.attempts)
        if call.answer:
            span.set_attributes(call.answer)
            first_token = call.first_token_since_start()
            if first_token is not None and semconv.TIME_TO_FIRST_TOKEN in call.answer:
                # What the program waited: from the call's start, not its last attempt's (whole ns).
                span.set_attribute(semconv.TIME_TO_FIRST_TOKEN, first_token)
        if call.request_id is not None:
            span.set_attribute(semconv.REQUEST_ID, call.request_id)
        span.end()
