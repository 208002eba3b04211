"""The direct path for phase spans (finished spans handed to the SDK's span processor) is taken
only on the SDK releases it is tested with, can be turned off, and writes the same spans as the
public API; only ``on_start`` tells them apart."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.version import __version__ as sdk_version

import llm_latency
from llm_latency import phase_spans
from llm_latency.phase_spans import direct_path_supported, sdk_release
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


def test_only_tested_sdk_releases_take_the_direct_path() -> None:
    tracer = TracerProvider().get_tracer("t")
    assert sdk_release(sdk_version) is not None
    assert direct_path_supported(tracer, sdk_version)
    assert not direct_path_supported(tracer, "2.0.0")
    assert not direct_path_supported(tracer, "1.42.9")
    assert not direct_path_supported(tracer, "a.b")
    assert not direct_path_supported(trace.NoOpTracer(), sdk_version)


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
    monkeypatch.setattr(phase_spans, "_SDK_VERSION", version)
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
