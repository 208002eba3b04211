"""The request span written at its end (``llm_latency.late_spans``) is the span the SDK's
``start_span`` makes: the same sampling decision, context, parent, attributes, status, events,
links and limits, for every kind of sampler decision. Only ``on_start`` tells them apart: a late
span that needs a live SDK span (an exception, a link, a limit that bites) becomes one at its
end, so its processors see ``on_start`` then."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import pytest
import requests
from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import (
    ReadableSpan,
    Span,
    SpanLimits,
    SpanProcessor,
    TracerProvider,
)
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
)
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TraceState
from opentelemetry.util.types import Attributes, AttributeValue

import llm_latency
from llm_latency.late_spans import LateSpan, start_late
from llm_latency.otel_internals import StartListeners, TracerParts, tracer_parts
from llm_latency.phase_spans import PhaseSpanWriter
from tests.servers import LLMServer, unused_port
from tests.span_tree import span_tree
from tests.test_patching import fetch

START = 1_700_000_000_000_000_000
ATTRIBUTES = {
    "http.request.method": "POST",
    "url.full": "https://api.example.com/v1/chat/completions",
    "server.address": "api.example.com",
    "server.port": 443,
    "url.template": "/v1/chat/completions",
}
END_ATTRIBUTES: dict[str, AttributeValue] = {
    "http.response.status_code": 429,
    "http.response.header.x-request-id": ("req_1",),
    "llm_latency.connection.reused": True,
    "llm_latency.server.processing_time": 0.25,
}


class Counting(IdGenerator):
    """Ids in sequence: two providers given one each make the same ids in the same order."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def generate_span_id(self) -> int:
        return next(self._ids)

    def generate_trace_id(self) -> int:
        return 1000 + next(self._ids)

    def is_trace_id_random(self) -> bool:  # as the SDK's own generator says (a W3C flag)
        return True


class Recorded(SpanProcessor):
    def __init__(self) -> None:
        self.started: list[str] = []
        self.ended: list[ReadableSpan] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.started.append(span.name)

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append(span)


class Deciding(Sampler):
    """A sampler with a decision of its own that adds an attribute and a trace state entry,
    and keeps what it was asked."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        self.asked: list[tuple[Any, ...]] = []

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        parent = trace.get_current_span(parent_context).get_span_context()
        self.asked.append((parent, trace_id, name, kind, dict(attributes or {}), list(links or ())))
        return SamplingResult(
            self.decision,
            {**(attributes or {}), "sampler.said": self.decision.name},
            TraceState([("llm", "1")]),
        )

    def get_description(self) -> str:
        return "Deciding"


def provider(sampler: Sampler, limits: SpanLimits | None = None) -> tuple[Any, Recorded]:
    recorded = Recorded()
    made = TracerProvider(sampler=sampler, id_generator=Counting(), span_limits=limits)
    made.add_span_processor(recorded)
    return made.get_tracer("llm_latency", "1"), recorded


Finish = Callable[[trace.Span], None]


def plain(span: trace.Span) -> None:
    span.set_attributes(END_ATTRIBUTES)
    span.set_status(Status(StatusCode.ERROR))


def marked(span: trace.Span) -> None:
    """A streamed attempt's marks: events without attributes."""
    plain(span)
    for offset, name in enumerate(("llm_latency.first_byte", "llm_latency.first_chunk"), 1):
        span.add_event(name, timestamp=START + offset)


def marked_with_attributes(span: trace.Span) -> None:
    plain(span)
    span.add_event("llm_latency.first_byte", {"why": "test"}, timestamp=START + 1)


def failed(span: trace.Span) -> None:
    span.set_attributes(END_ATTRIBUTES)
    try:
        raise ConnectionResetError("the peer closed it")
    except ConnectionResetError as error:
        span.record_exception(error, timestamp=START + 5)
    span.set_status(Status(StatusCode.ERROR, "ConnectionResetError"))


def parts(tracer: trace.Tracer) -> TracerParts:
    """What ``start_late`` is given of an SDK tracer."""
    found = tracer_parts(tracer)
    assert found is not None
    return found


def both(
    sampler: Callable[[], Sampler],
    finish: Finish,
    *,
    links: Sequence[Link] = (),
    limits: SpanLimits | None = None,
    parent: trace.Span | None = None,
) -> tuple[tuple[list[ReadableSpan], list[str], trace.Span], tuple[list[ReadableSpan], ...]]:
    """The same request span through ``start_late`` and through ``start_span``, each on a
    provider of its own with the same ids: what each processor saw."""
    results = []
    for late in (True, False):
        tracer, recorded = provider(sampler(), limits)
        token = None if parent is None else context_api.attach(trace.set_span_in_context(parent))
        try:
            if late:
                span = start_late(
                    parts(tracer), "POST /v1/chat/completions", SpanKind.CLIENT, dict(ATTRIBUTES),
                    links, START,
                )  # fmt: skip
            else:
                span = tracer.start_span(
                    "POST /v1/chat/completions",
                    kind=SpanKind.CLIENT,
                    attributes=dict(ATTRIBUTES),
                    links=links,
                    start_time=START,
                )
        finally:
            if token is not None:
                context_api.detach(token)
        finish(span)
        span.end(START + 10)
        results.append((recorded.ended, recorded.started, span))
    return results[0], (results[1][0],)


def same(ours: ReadableSpan, sdk: ReadableSpan) -> None:
    assert ours.name == sdk.name
    assert ours.context == sdk.context
    assert ours.parent == sdk.parent
    assert ours.kind == sdk.kind
    assert list((ours.attributes or {}).items()) == list((sdk.attributes or {}).items())
    assert ours.dropped_attributes == sdk.dropped_attributes
    assert (ours.status.status_code, ours.status.description) == (
        sdk.status.status_code,
        sdk.status.description,
    )
    assert (ours.start_time, ours.end_time) == (sdk.start_time, sdk.end_time)
    assert [(e.name, dict(e.attributes or {}), e.timestamp) for e in ours.events] == [
        (e.name, dict(e.attributes or {}), e.timestamp) for e in sdk.events
    ]
    assert [(link.context, dict(link.attributes or {})) for link in ours.links] == [
        (link.context, dict(link.attributes or {})) for link in sdk.links
    ]
    assert ours.dropped_links == sdk.dropped_links
    assert ours.resource == sdk.resource
    assert ours.instrumentation_scope == sdk.instrumentation_scope


@pytest.mark.parametrize(
    "sampler",
    [
        lambda: ParentBased(ALWAYS_ON),
        lambda: Deciding(Decision.RECORD_AND_SAMPLE),
        lambda: Deciding(Decision.RECORD_ONLY),
    ],
    ids=["parent-based", "sampled, with its attribute and trace state", "record only"],
)
@pytest.mark.parametrize("under_a_span", [False, True], ids=["root", "under the program's span"])
def test_a_recorded_span_is_the_sdks(sampler: Callable[[], Sampler], under_a_span: bool) -> None:
    parent = None
    if under_a_span:
        parent = trace.NonRecordingSpan(
            trace.SpanContext(7, 8, is_remote=True, trace_flags=trace.TraceFlags(1))
        )
    (ours, started, span), (sdk,) = both(sampler, plain, parent=parent)
    assert isinstance(span, LateSpan)
    assert started == []  # written at its end: on_end only
    assert len(ours) == len(sdk) == 1
    same(ours[0], sdk[0])
    assert not span.is_recording()


def test_the_sampler_is_asked_what_start_span_asks() -> None:
    samplers: list[Deciding] = []

    def kept() -> Sampler:
        samplers.append(Deciding(Decision.RECORD_AND_SAMPLE))
        return samplers[-1]

    previous = Link(trace.SpanContext(5, 6, is_remote=False))
    both(kept, plain, links=[previous])
    late, sdk = samplers
    assert late.asked == sdk.asked
    assert late.asked[0][4] == ATTRIBUTES


def test_a_dropped_span_is_the_sdks() -> None:
    (ours, started, span), (sdk,) = both(lambda: Deciding(Decision.DROP), plain)
    assert ours == sdk == [] and started == []
    assert not span.is_recording()
    tracer, _ = provider(Deciding(Decision.DROP))
    dropped = tracer.start_span("POST", start_time=START)
    assert span.get_span_context().trace_flags == dropped.get_span_context().trace_flags
    assert span.get_span_context().trace_state == dropped.get_span_context().trace_state


def test_marks_without_attributes_stay_late_and_are_the_sdks() -> None:
    """Events without attributes (the request span's first byte and first chunk) are written
    with the span at its end, as the SDK's events: no live span for them (it cost a streamed
    attempt more than its events)."""
    (ours, started, span), (sdk,) = both(lambda: ParentBased(ALWAYS_ON), marked)
    assert isinstance(span, LateSpan)
    assert started == []
    same(ours[0], sdk[0])
    assert [e.name for e in ours[0].events] == ["llm_latency.first_byte", "llm_latency.first_chunk"]


@pytest.mark.parametrize(
    ("case", "finish", "links", "limits"),
    [
        ("an exception", failed, (), None),
        (
            "a link",
            plain,
            (Link(trace.SpanContext(5, 6, is_remote=False), {"why": "retry"}),),
            None,
        ),
        ("attribute count", plain, (), SpanLimits(max_span_attributes=3)),
        ("an event with attributes", marked_with_attributes, (), None),
        ("more events than the limit", marked, (), SpanLimits(max_events=1)),
        ("value length", plain, (), SpanLimits(max_attribute_length=4)),
    ],
)
def test_what_only_a_live_span_records_makes_it_one_at_its_end(
    case: str, finish: Finish, links: Sequence[Link], limits: SpanLimits | None
) -> None:
    (ours, started, _), (sdk,) = both(
        lambda: ParentBased(ALWAYS_ON), finish, links=links, limits=limits
    )
    assert started == ["POST /v1/chat/completions"]  # the live span's start, at its end
    assert len(ours) == len(sdk) == 1
    same(ours[0], sdk[0])


def test_nothing_is_kept_after_the_end() -> None:
    tracer, recorded = provider(ParentBased(ALWAYS_ON))
    span = start_late(parts(tracer), "POST", SpanKind.CLIENT, {}, (), START)
    span.end(START + 1)
    span.set_attribute("late", True)
    span.set_status(Status(StatusCode.ERROR))
    span.record_exception(ValueError("late"))
    span.end(START + 2)
    (ended,) = recorded.ended
    assert dict(ended.attributes or {}) == {}
    assert ended.status.status_code is StatusCode.UNSET
    assert ended.events == () and ended.end_time == START + 1


# -- who listens at a span's start ----------------------------------------------------------------


class CopiesBaggage(SpanProcessor):
    """A processor that acts at a span's start (as a baggage-to-attribute processor does)."""

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        span.set_attribute("copied", True)


class QuietBatch(BatchSpanProcessor):
    """A subclass of the SDK's batch processor that adds nothing at the start."""


def test_the_request_span_is_late_only_while_no_processor_acts_at_its_start() -> None:
    made = TracerProvider()
    made.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    made.add_span_processor(QuietBatch(InMemorySpanExporter()))
    tracer = made.get_tracer("t")
    writer = PhaseSpanWriter(tracer)
    listeners = StartListeners(tracer)
    assert not listeners.listening()
    assert isinstance(writer.start_request("POST", SpanKind.CLIENT, {}, (), START), LateSpan)
    made.add_span_processor(CopiesBaggage())  # added later: seen at the next request
    assert listeners.listening()
    live = writer.start_request("POST", SpanKind.CLIENT, {}, (), START)
    assert not isinstance(live, LateSpan)
    assert isinstance(live, ReadableSpan) and dict(live.attributes or {}) == {"copied": True}
    off = PhaseSpanWriter(TracerProvider().get_tracer("t"), fast_path=False)
    assert not isinstance(off.start_request("POST", SpanKind.CLIENT, {}, (), START), LateSpan)


# -- the same trace either way, end to end ---------------------------------------------------------


async def traced(server: LLMServer, client: str, fast_path: bool) -> list[ReadableSpan]:
    """A streamed answer, a 429, and a refused connection through ``client``, with only the
    SDK's simple processor on the tracer: what it exported."""
    exporter = InMemorySpanExporter()
    made = TracerProvider()
    made.add_span_processor(SimpleSpanProcessor(exporter))
    llm_latency.uninstrument()
    llm_latency.instrument(
        tracer_provider=made, clients=[client], configure=False, phase_span_fast_path=fast_path
    )
    try:
        urls = [
            server.url(chunks=3, gap=0.01, sse=1),
            server.url(status=429),
            f"http://127.0.0.1:{unused_port()}/v1/chat/completions",
        ]
        for url in urls:
            with contextlib.suppress(aiohttp.ClientError, requests.RequestException):
                await fetch(client, url)
    finally:
        llm_latency.uninstrument()
    return list(exporter.get_finished_spans())


def _timeless(node: Any) -> Any:
    """A span tree with each measured duration (a float) replaced by its type."""
    if isinstance(node, dict):
        return {key: _timeless(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_timeless(item) for item in node]
    return float if isinstance(node, float) else node


def _outline(spans: list[ReadableSpan]) -> list[tuple[Any, ...]]:
    return [(s.name, s.status.status_code, [e.name for e in s.events], len(s.links)) for s in spans]


@pytest.mark.parametrize("client", ["aiohttp", "requests"])
async def test_late_request_spans_export_what_live_ones_do(server: LLMServer, client: str) -> None:
    late = await traced(server, client, fast_path=True)
    live = await traced(server, client, fast_path=False)
    assert _timeless(span_tree(late)) == _timeless(span_tree(live))
    assert _outline(late) == _outline(live)
    refused = [s for s in late if s.status.status_code is StatusCode.ERROR and s.events]
    assert refused, _outline(late)  # the refused connection's exception, recorded
