"""What the emitter keeps of one attempt while it runs, beside the adapter's ``Timeline``.

The Timeline holds what the client library did (timestamps, facts, the method as the client
sent it); an :class:`AttemptRecord` holds what the emitter decided when the attempt started:
its request span, the method in its semconv form, the target, the attempt's number in its
logical call, and the event-loop monitor that watches it; and, once it has ended, its facts (what
:mod:`llm_latency.attribute_table` names). The emitter never writes into the Timeline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llm_latency import providers

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

    from llm_latency.calls import LogicalCall
    from llm_latency.facts import AttemptFacts
    from llm_latency.lag_monitor import LoopLagMonitor
    from llm_latency.provider_schema import RouteFacts
    from llm_latency.timeline import Timeline


class AttemptRecord:
    """One started attempt, as the emitter sees it (read by the metrics and the pool
    metrics too)."""

    __slots__ = (
        "call",
        "context",
        "facts",
        "host",
        "loop_monitor",
        "method",
        "port",
        "resend_count",
        "route",
        "span",
        "timeline",
    )

    #: The attempt's facts, set when it has ended (unset before).
    facts: AttemptFacts

    def __init__(
        self,
        timeline: Timeline,
        span: Span,
        context: Context,
        method: str,
        host: str,
        port: int | None,
        resend_count: int,
        call: LogicalCall | None,
        route: RouteFacts | None = None,
    ) -> None:
        self.timeline = timeline
        #: The request span.
        self.span = span
        #: A context whose span is the request span: what the request carries in
        #: ``traceparent``, the parent of the phase spans and the metrics' exemplar trace.
        self.context = context
        #: ``http.request.method``: the client's method, or ``_OTHER`` for an unknown one.
        self.method = method
        self.host = host
        self.port = port
        #: ``http.request.resend_count``: the client's own count, or the attempt's number in
        #: its logical call, whichever is higher.
        self.resend_count = resend_count
        #: The logical call this attempt belongs to, if any.
        self.call = call
        #: What the known route the attempt went to says (its provider if its own, its
        #: operation); None off the known routes.
        self.route = route
        #: The monitor of the event loop the attempt runs on (async clients), until it ends.
        self.loop_monitor: LoopLagMonitor | None = None

    @property
    def provider(self) -> str | None:
        """``gen_ai.provider.name``: the provider whose own host the attempt went to, else the
        owner of its route; None when neither says."""
        route = self.route
        return providers.provider_name(self.host, None if route is None else route.owner)
