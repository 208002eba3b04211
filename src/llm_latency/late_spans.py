"""The request span written once, at its end.

Through the SDK's ``Tracer.start_span``, a request span costs a live ``Span``: its locks, its
attribute cleaning (each value checked and copied), its event and link lists, the processors'
``on_start``, then a copy into a ``ReadableSpan`` at its end; about 110 k instructions with no
attribute, 8 k more per attribute, here. llm-latency needs little of it while the attempt runs:
the span's context (for ``traceparent``, for the phase spans and the metrics' exemplars) and a
place to gather its attributes. So, on the SDK releases the direct path is tested with
(:func:`~llm_latency.otel_internals.tracer_parts`), :func:`start_late` takes the sampling
decision exactly as ``start_span`` does (the tracer's sampler, on the same name, kind,
attributes and links, in the current context; the same trace flags and trace state) and returns
a :class:`LateSpan`, which keeps what the attempt sets and, at its end, hands one finished
``ReadableSpan`` to the tracer's span processor: about 50 k instructions in all.

What differs from ``start_span``: the span processors would see the request span in ``on_end``
only, not in ``on_start`` nor ``_on_ending``. So it is taken only while no span processor of
the tracer does anything there (:class:`~llm_latency.otel_internals.StartListeners`: the SDK's
batch and simple processors do nothing; a processor that copies baggage into attributes at the
start, say, does), and ``instrument(phase_span_fast_path=False)`` turns it off with the phase
spans' direct path. Events without attributes (the request span's marks: its first byte,
chunk and token) go into the ``ReadableSpan`` as the SDK's ``Event`` objects. A span that needs
what only a live SDK span does (an exception or an event with attributes, more events than the
limit, a link, an attribute limit that bites) is made a live SDK span at its end, with the same
context, start time and attributes, and ended there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from llm_latency.otel_internals import LiveSpan, TracerParts

try:  # the SDK is an extra: the direct path's only (start_late is called with its tracer's parts)
    from opentelemetry.sdk.trace import Event, ReadableSpan
except ImportError:  # pragma: no cover
    Event = ReadableSpan = None  # type: ignore[assignment,misc]

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
_UNSET = Status(StatusCode.UNSET)

#: What a span records beyond attributes and status, replayed on the live span it becomes:
#: ``(method name, positional arguments, keyword arguments)``.
_Replay = tuple[str, tuple[Any, ...], dict[str, Any]]


def start_late(
    sdk: TracerParts,
    name: str,
    kind: SpanKind,
    attributes: dict[str, Any],
    links: Sequence[Link],
    start_time: int,
) -> Span:
    """Start a request span on the SDK tracer of ``sdk`` as its ``start_span`` would, in the
    current context; the span is written at its end (see the module's docstring)."""
    current = trace.get_current_span().get_span_context()
    is_enabled = sdk.is_enabled
    if not is_enabled():
        return NonRecordingSpan(current)
    tracer = sdk.tracer
    parent: SpanContext | None = None
    if current is None or not current.is_valid:
        trace_id = tracer.id_generator.generate_trace_id()
        random_trace_id = tracer.id_generator.is_trace_id_random()
    else:
        parent = current
        trace_id = current.trace_id
        random_trace_id = current.trace_flags.random_trace_id
    sampling = tracer.sampler.should_sample(None, trace_id, name, kind, attributes, links)
    decision = sampling.decision
    flags = _SAMPLED if decision.is_sampled() else _NOT_SAMPLED
    if random_trace_id:
        flags = TraceFlags(flags | TraceFlags.RANDOM_TRACE_ID)
    context = SpanContext(
        trace_id,
        tracer.id_generator.generate_span_id(),
        is_remote=False,
        trace_flags=flags,
        trace_state=sampling.trace_state,
    )
    end_metrics = sdk.tracer_metrics.start_span(parent, decision)
    if not decision.is_recording():
        return NonRecordingSpan(context)
    return LateSpan(
        sdk, name, context, parent, kind, dict(sampling.attributes), links, start_time,
        end_metrics,
    )  # fmt: skip


class LateSpan(Span):
    """A recording request span that is written when it ends (see the module's docstring)."""

    __slots__ = (
        "_attributes",
        "_context",
        "_end_metrics",
        "_end_time",
        "_kind",
        "_links",
        "_name",
        "_parent",
        "_replay",
        "_sdk",
        "_start_time",
        "_status",
    )

    def __init__(
        self,
        sdk: TracerParts,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: dict[str, Any],
        links: Sequence[Link],
        start_time: int,
        end_metrics: Callable[[], None],
    ) -> None:
        self._sdk = sdk
        self._name = name
        self._context = context
        self._parent = parent
        self._kind = kind
        #: Values as the SDK keeps them (str, bool, int, float, tuples of those).
        self._attributes = attributes
        self._links = links
        self._start_time = start_time
        self._end_time: int | None = None
        self._status = _UNSET
        self._replay: list[_Replay] = []
        self._end_metrics = end_metrics

    def get_span_context(self) -> SpanContext:
        return self._context

    def is_recording(self) -> bool:
        return self._end_time is None

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        """Keep ``attributes``, whose values must be as the SDK keeps them."""
        if self._end_time is None:
            self._attributes.update(attributes)

    def set_attribute(self, key: str, value: Any) -> None:
        if self._end_time is None:
            self._attributes[key] = value

    def update_name(self, name: str) -> None:
        if self._end_time is None:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self._end_time is not None or self._status.status_code is StatusCode.OK:
            return
        if not isinstance(status, Status):
            status = Status(status, description)
        if status.status_code is not StatusCode.UNSET:
            self._status = status

    def add_event(
        self, name: str, attributes: Mapping[str, Any] | None = None, timestamp: int | None = None
    ) -> None:
        if self._end_time is None:
            at = time.time_ns() if timestamp is None else timestamp
            self._replay.append(("add_event", (name, attributes, at), {}))

    def add_link(self, context: SpanContext, attributes: Mapping[str, Any] | None = None) -> None:
        if self._end_time is None:
            self._replay.append(("add_link", (context, attributes), {}))

    def record_exception(
        self,
        exception: BaseException,
        attributes: Mapping[str, Any] | None = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        if self._end_time is None:
            at = time.time_ns() if timestamp is None else timestamp
            self._replay.append(("record_exception", (exception, attributes, at, escaped), {}))

    def end(self, end_time: int | None = None) -> None:
        """Write the span, finished, to the tracer's span processor (once)."""
        if self._end_time is not None:
            return
        self._end_time = end_time = time.time_ns() if end_time is None else end_time
        sdk = self._sdk
        limits = sdk.limits
        events = _plain_events(self._replay, limits.max_events) if self._replay else ()
        if (
            events is None
            or self._links
            or limits.max_span_attribute_length is not None
            or (
                limits.max_span_attributes is not None
                and len(self._attributes) > limits.max_span_attributes
            )
        ):
            self._end_live(end_time)
        else:
            tracer = sdk.tracer
            tracer.span_processor.on_end(
                ReadableSpan(
                    name=self._name,
                    context=self._context,
                    parent=self._parent,
                    resource=tracer.resource,
                    attributes=self._attributes,
                    events=events,
                    kind=self._kind,
                    status=self._status,
                    start_time=self._start_time,
                    end_time=end_time,
                    instrumentation_info=tracer.instrumentation_info,
                    instrumentation_scope=sdk.scope,
                )
            )
        self._replay = []
        self._end_metrics()

    def _end_live(self, end_time: int) -> None:
        """Make the span an SDK span with the same context and start, replay what only it
        records, and end it: the SDK applies its limits, events and links."""
        sdk = self._sdk
        tracer = sdk.tracer
        live = LiveSpan(
            name=self._name,
            context=self._context,
            parent=self._parent,
            sampler=tracer.sampler,
            resource=tracer.resource,
            attributes=self._attributes,
            span_processor=tracer.span_processor,
            kind=self._kind,
            links=self._links,
            instrumentation_info=tracer.instrumentation_info,
            limits=sdk.limits,
            instrumentation_scope=sdk.scope,
        )
        live.start(start_time=self._start_time)
        for method, args, kwargs in self._replay:
            getattr(live, method)(*args, **kwargs)
        if self._status is not _UNSET:
            live.set_status(self._status)
        live.end(end_time)


def _plain_events(replay: list[_Replay], max_events: int | None) -> tuple[Event, ...] | None:
    """What was replayed, as the events of the finished span, when it is only events without
    attributes within the SDK's event limit (the request span's marks: its first byte, chunk
    and token, its connection acquired); None when something else needs the live span, which
    applies the limits and records exceptions. A streamed attempt went through the live span
    for its events alone, which cost it more than its events."""
    if max_events is not None and len(replay) > max_events:
        return None
    events = []
    for method, args, _ in replay:
        if method != "add_event" or args[1]:
            return None
        events.append(Event(args[0], None, args[2]))
    return tuple(events)
