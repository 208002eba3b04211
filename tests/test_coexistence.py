"""llm-latency beside the official instrumentations: one CLIENT span per request (theirs), with
llm-latency's attempt span (INTERNAL) and its phases beneath it; under a GenAI span from
``opentelemetry-instrumentation-openai-v2``, the attempts and waits are that span's children."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import openai
import pytest
import requests
from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.instrumentation.requests import RequestsInstrumentor
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from tests.attributes import attributes
from tests.conftest import Telemetry
from tests.provider_api import provider_server
from tests.servers import LLMServer

OFFICIAL: dict[str, Callable[[], Any]] = {
    "aiohttp": AioHttpClientInstrumentor,
    "httpx-async": HTTPXClientInstrumentor,
    "httpx-sync": HTTPXClientInstrumentor,
    "requests": RequestsInstrumentor,
}


@pytest.fixture
def official(request: pytest.FixtureRequest, telemetry: Telemetry) -> Iterator[Any]:
    instrumentor = OFFICIAL[request.param]()
    instrumentor.instrument(
        tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
    )
    try:
        yield request.param
    finally:
        instrumentor.uninstrument()


async def send(kind: str, url: str) -> None:
    if kind == "aiohttp":
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            await response.read()
    elif kind == "httpx-async":
        async with httpx.AsyncClient() as client:
            await client.get(url)
    elif kind == "httpx-sync":
        await asyncio.to_thread(lambda: httpx.Client().get(url))
    else:
        await asyncio.to_thread(lambda: requests.get(url))


def children(telemetry: Telemetry, parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [s for s in telemetry.spans() if s.parent and s.parent.span_id == parent.context.span_id]


@pytest.mark.parametrize("official", sorted(OFFICIAL), indirect=True)
async def test_one_client_span_per_request(
    telemetry: Telemetry, server: LLMServer, official: str
) -> None:
    await send(official, server.url(wait=0.05))
    clients = [s for s in telemetry.spans() if s.kind is SpanKind.CLIENT]
    assert len(clients) == 1
    (theirs,) = clients
    assert theirs.instrumentation_scope is not None
    assert theirs.instrumentation_scope.name.startswith("opentelemetry.instrumentation.")
    (ours,) = [s for s in children(telemetry, theirs) if s.name == "GET /v1/chat/completions"]
    assert ours.kind is SpanKind.INTERNAL
    assert attributes(ours)["http.response.header.x-request-id"] == ("req_test_123",)
    assert {"send", "wait", "receive"} <= set(telemetry.phases(ours))
    # The server's traceparent belongs to the same trace.
    assert theirs.context is not None
    traceparent = server.requests[-1]["headers"]["traceparent"]
    assert traceparent.split("-")[1] == f"{theirs.context.trace_id:032x}"
    telemetry.assert_all_ended_once()


async def test_genai_span_from_openai_v2_is_the_parent(telemetry: Telemetry) -> None:
    instrumentor = OpenAIInstrumentor()  # type: ignore[no-untyped-call]  # its __init__ has no annotations
    instrumentor.instrument(
        tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
    )
    try:
        async with provider_server() as provider:
            client = openai.AsyncOpenAI(base_url=provider.openai_base, api_key="sk-test")
            await client.chat.completions.create(
                model="gpt-test",
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"x-test-scenario": "openai-v2", "x-test-fail": "1"},
            )
    finally:
        instrumentor.uninstrument()
    genai = [s for s in telemetry.spans() if s.instrumentation_scope
             and s.instrumentation_scope.name == "opentelemetry.instrumentation.openai_v2"]  # fmt: skip
    assert len(genai) == 1
    (parent,) = genai
    assert [s.name for s in telemetry.spans() if s.name.startswith("openai ")] == []
    below = sorted(children(telemetry, parent), key=lambda s: s.start_time or 0)
    assert [s.name for s in below] == [
        "POST /v1/chat/completions",
        "retry.backoff",
        "POST /v1/chat/completions",
    ]
    assert [s.kind for s in below] == [SpanKind.CLIENT, SpanKind.INTERNAL, SpanKind.CLIENT]
    telemetry.assert_all_ended_once()


OPENLLMETRY_PROGRAM = Path(__file__).parent / "programs" / "openllmetry_call.py"


def openllmetry_spans(sdk: str) -> list[dict[str, Any]]:
    """The spans of one SDK call (a 429, then a success) under OpenLLMetry's instrumentation of
    that SDK, from a process of its own (see the program's docstring)."""
    done = subprocess.run(
        [sys.executable, str(OPENLLMETRY_PROGRAM), sdk],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def below(spans: list[dict[str, Any]], parent: dict[str, Any]) -> list[tuple[str, str]]:
    kids = sorted(
        (s for s in spans if s["parent_id"] == parent["span_id"]), key=lambda s: s["start"]
    )
    return [(s["name"], s["kind"]) for s in kids]


def theirs(spans: list[dict[str, Any]], sdk: str) -> dict[str, Any]:
    (span,) = [s for s in spans if s["scope"].startswith(f"opentelemetry.instrumentation.{sdk}")]
    assert span["genai"], span
    return span


def attempt_backoff_attempt(route: str) -> list[tuple[str, str]]:
    attempt = (f"POST {route}", "CLIENT")
    return [attempt, ("retry.backoff", "INTERNAL"), attempt]


def test_genai_span_from_openllmetry_openai_is_the_parent() -> None:
    """OpenLLMetry's openai span (``gen_ai.*`` attributes, current during the call): the
    attempts and the backoff go beneath it, with no second parent."""
    spans = openllmetry_spans("openai")
    assert [s["name"] for s in spans if s["name"].startswith("openai ")] == []
    assert below(spans, theirs(spans, "openai")) == attempt_backoff_attempt("/v1/chat/completions")


def test_beside_openllmetry_anthropic_the_call_is_still_grouped() -> None:
    """OpenLLMetry's anthropic instrumentation starts its span without making it current
    (``tracer.start_span``, never attached), so nothing can go beneath it: llm-latency's own
    call span groups the attempts and the backoff, as without that instrumentation."""
    spans = openllmetry_spans("anthropic")
    other = theirs(spans, "anthropic")
    (ours,) = [s for s in spans if s["name"] == "anthropic messages"]
    assert ours["parent_id"] != other["span_id"]
    assert below(spans, ours) == attempt_backoff_attempt("/v1/messages")
