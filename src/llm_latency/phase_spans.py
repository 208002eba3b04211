"""Writing phase spans cheaply.

A phase span is known in full only once its attempt has ended: name, parent, start and end.
Through the SDK's ``Tracer.start_span`` each one costs a sampler decision, a mutable span and
two processor calls (about 15 µs here); built as the finished ``ReadableSpan`` it is and
handed to the tracer's span processor, it costs about 3 µs. That path is taken for the
phases that succeeded, when the tracer is the OpenTelemetry SDK's and the request span is
sampled (a sampled parent is what a ParentBased sampler would follow). Span processors see
these spans in ``on_end`` only, not in ``on_start``. Otherwise, and for the phase that failed
(it carries an exception event), the public API is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanContext, SpanKind, Tracer

from llm_latency import semconv
from llm_latency.timeline import PHASE_NAMES

try:  # the SDK is a dependency, but the tracer in use may be another implementation's
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace import Tracer as SdkTracer
except ImportError:  # pragma: no cover
    SdkTracer = None  # type: ignore[assignment,misc]

_INTERNAL = SpanKind.INTERNAL

#: Hosts whose attribute sets are kept at most (beyond, they are built per span).
_MAX_HOSTS = 256


class PhaseSpanWriter:
    """Emits one finished phase span under a request span."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer
        self._sdk = SdkTracer is not None and isinstance(tracer, SdkTracer)
        # host -> ``{llm_latency.phase, server.address}`` per phase, shared read-only by every
        # span and phase-duration measurement of that phase and host (span metrics and
        # dashboards filter phases by host).
        self._attributes: dict[str, tuple[Mapping[str, Any], ...]] = {}

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
        """Hand a finished, successful phase span to the SDK's span processor."""
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
                instrumentation_scope=tracer._instrumentation_scope,
            )
        )

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
