"""The direct path for phase spans (finished spans handed to the SDK's span processor) is taken
only on the SDK releases it is tested with, can be turned off, and writes the same spans as the
public API; only ``on_start`` tells them apart. The request span's end attributes, written
directly, are what ``Span.set_attributes`` makes of them, limits included."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.version import __version__ as sdk_version

import llm_latency
from llm_latency import otel_internals, phase_spans
from tests.conftest import Telemetry
from tests.servers import LLMServer
from tests.span_tree import span_tree


class StartedNames(SpanProcessor):
    """The names of the spans its ``on_start`` saw (a baggage-to-attribute processor's view)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.names.append(span.name)

    def on_end(self, span: ReadableSpan) -> None:
        pass


async def traced_request(
    telemetry: Telemetry, server: LLMServer, **options: Any
) -> tuple[list[dict[str, Any]], list[str]]:
    started = StartedNames()
    telemetry.tracer_provider.add_span_processor(started)
    llm_latency.uninstrument()  # the fixture's default set-up
    telemetry.instrument(**options)
    async with aiohttp.ClientSession() as session:
        async with session.post(server.url(wait=0.01), json={}) as response:
            await response.read()
    return span_tree(telemetry.spans()), started.names


PHASES = ["http.connect", "http.send", "http.wait", "http.receive"]


@pytest.mark.parametrize(
    ("case", "options", "version", "on_start_sees_phases"),
    [
        ("direct path", {}, sdk_version, False),
        ("turned off", {"phase_span_fast_path": False}, sdk_version, True),
        ("untested SDK release", {}, "2.0.0", True),
    ],
)
async def test_the_same_trace_either_way(
    telemetry: Telemetry,
    server: LLMServer,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    options: dict[str, Any],
    version: str,
    on_start_sees_phases: bool,
) -> None:
    monkeypatch.setattr(otel_internals, "SDK_VERSION", version)
    tree, started = await traced_request(telemetry, server, **options)
    (request,) = tree
    assert request["name"] == "POST /v1/chat/completions"
    assert [child["name"] for child in request["children"]] == PHASES
    assert [child["attributes"]["llm_latency.phase"] for child in request["children"]] == [
        "connect",
        "send",
        "wait",
        "receive",
    ]
    assert started[0] == "POST /v1/chat/completions"
    assert (started[1:] == PHASES) is on_start_sees_phases, started
    if not on_start_sees_phases:
        assert started == ["POST /v1/chat/completions"]


END_ATTRIBUTES: dict[str, Any] = {
    "http.response.header.x-request-id": ("req_abcdef",),
    "http.response.status_code": 200,
    "network.protocol.version": "1.1",
    "llm_latency.connection.reused": True,
    "llm_latency.server.processing_time": 0.25,
}


@pytest.mark.parametrize(
    ("limits", "direct"),
    [
        (SpanLimits(), True),
        (SpanLimits(max_span_attributes=3), False),  # no room for all: the SDK drops, counts
        (SpanLimits(max_attribute_length=4), False),  # the SDK truncates each string
    ],
    ids=["no limits reached", "attribute count", "value length"],
)
def test_end_attributes_are_what_set_attributes_makes(
    monkeypatch: pytest.MonkeyPatch, limits: SpanLimits, direct: bool
) -> None:
    """The request span's end attributes, written directly where the span's limits allow it,
    come out as ``Span.set_attributes`` makes them; where a limit applies, the SDK does it."""
    checked: list[int] = []
    set_items = BoundedAttributes._set_items

    def counted(self: BoundedAttributes, attributes: Any) -> None:
        checked.append(len(attributes))
        set_items(self, attributes)

    tracer = TracerProvider(span_limits=limits).get_tracer("t")
    writer = phase_spans.PhaseSpanWriter(tracer)
    ours = tracer.start_span("ours", attributes={"url.full": "http://127.0.0.1/"})
    sdk = tracer.start_span("sdk", attributes={"url.full": "http://127.0.0.1/"})
    monkeypatch.setattr(BoundedAttributes, "_set_items", counted)
    writer.set_attributes(ours, dict(END_ATTRIBUTES))
    assert checked == ([] if direct else [len(END_ATTRIBUTES)])
    sdk.set_attributes(dict(END_ATTRIBUTES))
    ours.end()
    sdk.end()
    assert isinstance(ours, ReadableSpan) and isinstance(sdk, ReadableSpan)
    assert dict(ours.attributes or {}) == dict(sdk.attributes or {})
    assert list(ours.attributes or {}) == list(sdk.attributes or {})
    assert ours.dropped_attributes == sdk.dropped_attributes


def test_end_attributes_on_an_ended_span_are_refused_as_the_sdk_does() -> None:
    tracer = TracerProvider().get_tracer("t")
    span = tracer.start_span("ended")
    span.end()
    phase_spans.PhaseSpanWriter(tracer).set_attributes(span, dict(END_ATTRIBUTES))
    assert isinstance(span, ReadableSpan)
    assert dict(span.attributes or {}) == {}
