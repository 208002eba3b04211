"""The start of an attempt's request span: its name, kind, attributes known at the start and
links; and the trace context its request carries.

The name is the method and, for an LLM API's own route, the route's template (``POST
/v1/chat/completions``); the kind is CLIENT, or INTERNAL under an official HTTP client
instrumentation's span for the same request (one CLIENT span per request: ours is its detail).
An earlier attempt of the same call (a redirect, a resend) is linked. The span is started
through the writer of the tracer in use (:class:`~llm_latency.phase_spans.PhaseSpanWriter`:
written whole at its end where the SDK allows it).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from opentelemetry import propagate
from opentelemetry.trace import Link, Span, SpanKind, set_span_in_context
from opentelemetry.util.http import sanitize_method

from llm_latency import semconv
from llm_latency.attempt_record import AttemptRecord
from llm_latency.calls import LogicalCall
from llm_latency.span_writer import SpanWriter
from llm_latency.suppression import under_http_client_span
from llm_latency.timeline import Timeline
from llm_latency.urls import redact, route

#: Distinct request methods whose names are remembered (a program sends a handful).
_MAX_METHODS = 32

_CLIENT = SpanKind.CLIENT
_INTERNAL = SpanKind.INTERNAL


class RequestStart:
    """Starts the request spans of an instrumentation's attempts."""

    def __init__(self, spans: SpanWriter, *, propagate: bool) -> None:
        self._spans = spans
        #: Inject the trace context into each request (``instrument(propagate=...)``).
        self._propagate = propagate
        #: Request methods as the spans and metrics name them, by the method sent.
        self._known_methods: dict[str, str] = {}

    def start(
        self,
        timeline: Timeline,
        call: LogicalCall | None,
        resend_count: int,
        target: tuple[str, int | None, str],
        previous: Span | None,
    ) -> AttemptRecord:
        """Start the request span of the attempt (of ``call``, if any, in which it is
        ``resend_count``) to ``target`` (host, port, path), linked to ``previous`` (an earlier
        attempt's); the attempt's record."""
        host, port, path = target
        method = timeline.method
        template, route_facts = route(path)
        known = self._known_methods.get(method) or self._known_method(method)
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
            timeline.llm_route = True
        if timeline.client:
            attributes[semconv.CLIENT] = timeline.client
        name = (
            f"{known if known != '_OTHER' else 'HTTP'} {template}"
            if template
            else (known if known != "_OTHER" else "HTTP")
        )
        links = () if previous is None else (Link(previous.get_span_context()),)
        # Under an official HTTP client instrumentation's span for the same request, ours is
        # its detail: one CLIENT span per request.
        kind = _INTERNAL if under_http_client_span() else _CLIENT
        span = self._spans.phases.start_request(
            name, kind, attributes, links, timeline.epoch_start_ns
        )
        context = set_span_in_context(span)
        return AttemptRecord(
            timeline, span, context, known, host, port, resend_count, call, route_facts
        )

    def inject(self, carrier: MutableMapping[str, str] | None, record: AttemptRecord) -> None:
        """Put the attempt's trace context (``traceparent``) into the request's ``carrier``,
        unless the program said not to."""
        if carrier is not None and self._propagate:
            propagate.inject(carrier, context=record.context)

    def _known_method(self, method: str) -> str:
        """``method`` as the spans and metrics name it: unknown methods are "_OTHER", unless
        ``OTEL_PYTHON_INSTRUMENTATION_HTTP_CAPTURE_ALL_METHODS`` says to keep them. Decided
        once per method (reading the variable costs more than the rest of a span's start
        attributes), for the first ``_MAX_METHODS`` methods seen."""
        known = sanitize_method(method) or "_OTHER"
        if len(self._known_methods) < _MAX_METHODS:
            self._known_methods[method] = known
        return known
