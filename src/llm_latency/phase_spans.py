"""Writing phase spans cheaply.

A phase span is known in full only once its attempt has ended: name, parent, start and end.
Through the SDK's ``Tracer.start_span`` each one costs a sampler decision, a mutable span and
two processor calls (about 15 µs here); built as the finished ``ReadableSpan`` it is and
handed to the tracer's span processor, it costs about 3 µs. That path is taken for the
phases that succeeded, when the tracer is the OpenTelemetry SDK's and the request span is
sampled (a sampled parent is what a ParentBased sampler would follow). Span processors see
these spans in ``on_end`` only, not in ``on_start``. Otherwise, and for the phase that failed
(it carries an exception event), the public API is used.

The request span's attributes known at its end go the same way: ``Span.set_attributes`` checks
and copies every value (each list into a tuple) through the SDK's attribute cleaning, about a
tenth of what llm-latency adds to a request; the values the emitter builds are already in the
form the cleaning produces, so they are written into the span's attribute mapping under its
locks, when the span is the SDK's and the whole set fits its limits (no value-length limit, room
for every attribute). Otherwise ``set_attributes`` is called.

The direct path reads the SDK tracer's ``span_processor``, ``id_generator`` and ``resource``,
and, through :mod:`llm_latency.otel_internals` (bound once per writer), its instrumentation
scope and a live span's attribute mapping: it is taken only with an SDK release that module's
gate lets through (:data:`~llm_latency.otel_internals.FAST_PATH_SDK`), and only when the
program has not turned it off (``instrument(phase_span_fast_path=False)``: for span processors
that need ``on_start``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Tracer

from llm_latency import otel_internals, semconv
from llm_latency.late_spans import LateSpan, start_late
from llm_latency.otel_internals import StartListeners, TracerParts, set_clean_attributes
from llm_latency.timeline import PHASE_NAMES

try:  # the SDK is an extra, and the tracer in use may be another implementation's
    from opentelemetry.sdk.trace import ReadableSpan
except ImportError:  # pragma: no cover
    ReadableSpan = None  # type: ignore[assignment,misc]

_INTERNAL = SpanKind.INTERNAL

#: Hosts whose attribute sets are kept at most (beyond, they are built per span).
_MAX_HOSTS = 256


class PhaseSpanWriter:
    """Emits one finished phase span under a request span."""

    def __init__(self, tracer: Tracer, *, fast_path: bool = True) -> None:
        self._tracer = tracer
        #: What the direct path reads of the SDK tracer (None: the public API).
        self._sdk: TracerParts | None = otel_internals.tracer_parts(tracer) if fast_path else None
        self._scope = None if self._sdk is None else self._sdk.scope
        self._start_listeners = StartListeners(tracer)
        # host -> ``{llm_latency.phase, server.address}`` per phase, shared read-only by every
        # span and phase-duration measurement of that phase and host (span metrics and
        # dashboards filter phases by host).
        self._attributes: dict[str, tuple[Mapping[str, Any], ...]] = {}

    def start_request(
        self,
        name: str,
        kind: SpanKind,
        attributes: dict[str, Any],
        links: Sequence[Link],
        start_time: int,
    ) -> Span:
        """Start an attempt's request span: written at its end (:mod:`llm_latency.late_spans`)
        on the direct path while no span processor acts at a span's start, else through the
        tracer's ``start_span``."""
        if self._sdk and not self._start_listeners.listening():
            return start_late(self._sdk, name, kind, attributes, links, start_time)
        return self._tracer.start_span(
            name, kind=kind, attributes=attributes, links=links, start_time=start_time
        )

    def attributes(self, phase: int, host: str) -> Mapping[str, Any]:
        """The attributes of a phase, for its span and its ``llm_latency.phase.duration``
        measurement: the phase and the attempt's ``server.address``."""
        per_phase = self._attributes.get(host)
        if per_phase is None:
            per_phase = tuple(
                MappingProxyType({semconv.PHASE: name, semconv.SERVER_ADDRESS: host})
                for name in PHASE_NAMES
            )
            if len(self._attributes) < _MAX_HOSTS:
                self._attributes[host] = per_phase
        return per_phase[phase]

    def fast_path(self, parent: Span) -> SpanContext | None:
        """The parent's context when finished spans can be written directly, else None."""
        if not self._sdk:
            return None
        context = parent.get_span_context()
        return context if context.trace_flags.sampled and parent.is_recording() else None

    def write(
        self,
        phase: int,
        attributes: Mapping[str, Any],
        parent: SpanContext,
        start_ns: int,
        end_ns: int,
    ) -> None:
        """Hand a finished, successful phase span to the SDK's span processor (only with a
        context :meth:`fast_path` gave)."""
        tracer: Any = self._tracer
        context = SpanContext(
            parent.trace_id,
            tracer.id_generator.generate_span_id(),
            False,
            parent.trace_flags,
            parent.trace_state,
        )
        tracer.span_processor.on_end(
            ReadableSpan(
                name=semconv.PHASE_SPAN_NAMES[phase],
                context=context,
                parent=parent,
                resource=tracer.resource,
                attributes=attributes,
                kind=_INTERNAL,
                start_time=start_ns,
                end_time=end_ns,
                instrumentation_scope=self._scope,
            )
        )

    def set_attributes(self, span: Span, attributes: dict[str, Any]) -> None:
        """Add ``attributes`` to a recording span, as ``span.set_attributes`` would. Their
        values must be as the SDK keeps them: str, bool, int, float, or tuples of those."""
        if type(span) is LateSpan or not self._sdk:
            span.set_attributes(attributes)
        else:
            set_clean_attributes(span, attributes)

    def start(
        self, phase: int, attributes: Mapping[str, Any], context: Context, start_ns: int
    ) -> Span:
        """Start a phase span through the public API (the caller ends it)."""
        return self._tracer.start_span(
            semconv.PHASE_SPAN_NAMES[phase],
            context=context,
            kind=_INTERNAL,
            attributes=attributes,
            start_time=start_ns,
        )
