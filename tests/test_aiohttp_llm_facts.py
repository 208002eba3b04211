"""aiohttp: the LLM facts on the request span: provider headers, server processing time,
network overhead, route templates, stream statistics, and the metrics recorded with them."""

from __future__ import annotations

import contextlib
import re
from typing import Any

import aiohttp
import pytest
from dirty_equals import IsFloat

from tests.attributes import float_attr, longest_gap_seen
from tests.checks import SLACK, histogram
from tests.conftest import Telemetry
from tests.servers import LLMServer
from tests.span_tree import phase_nodes, span_tree


def request_to(method: str, url: str) -> dict[str, Any]:
    """A request span's attributes that come from its request to the test server's ``url``, on
    a new connection from the event loop."""
    return {
        "http.request.method": method,
        "llm_latency.connection.reused": False,
        "llm_latency.event_loop.lag": IsFloat(),
        "network.peer.address": "127.0.0.1",  # the test server listens there only
        "network.protocol.version": "1.1",
        "server.address": "127.0.0.1",
        "server.port": "PORT",
        "url.full": re.sub(r":\d+/", ":PORT/", url, count=1),
    }


#: The headers the test server sends with every answer (captured by default).
SERVER_HEADERS = {
    "http.response.header.x-ratelimit-remaining-requests": ["42"],
    "http.response.header.x-ratelimit-remaining-tokens": ["9000"],
    "http.response.header.x-request-id": ["req_test_123"],
    "llm_latency.request_id": "req_test_123",
}
NEW_CONNECTION = phase_nodes("connect", "send", "wait", "receive")


async def test_streamed_completion_facts(telemetry: Telemetry, server: LLMServer) -> None:
    async with aiohttp.ClientSession() as session:
        url = server.url(wait=0.2, chunks=5, gap=0.1, sse=1)
        async with session.post(url, json={"stream": True}) as response:
            lines = [line async for line in response.content]
    assert lines[-2] == b"data: [DONE]\n"
    # The provider's facts from its headers (no set-cookie: only the listed headers are kept),
    # and the stream's; the measured ones are bounded below.
    assert span_tree(telemetry.spans()) == [
        {
            "name": "POST /v1/chat/completions",
            "kind": "CLIENT",
            "attributes": {
                **request_to("POST", url),
                **SERVER_HEADERS,
                "gen_ai.response.time_to_first_chunk": IsFloat(),
                "http.response.header.openai-processing-ms": ["200"],
                "http.response.status_code": 200,
                "llm_latency.network_overhead": IsFloat(ge=0),
                "llm_latency.server.processing_time": 0.2,
                "llm_latency.stream.events": 6,  # five deltas and [DONE]
                # Its first delta's content, and no usage: OpenAI's without include_usage.
                "llm_latency.time_to_first_token": IsFloat(),
                "llm_latency.usage.unknown": True,
                "llm_latency.stream.max_gap": IsFloat(),
                "llm_latency.stream.mean_interval": IsFloat(),
                "llm_latency.stream.chunk_rate": IsFloat(),
                "url.template": "/v1/chat/completions",
            },
            "children": NEW_CONNECTION,
        }
    ]
    request = telemetry.request()
    phases = telemetry.phases(request)
    send, wait = phases["send"], phases["wait"]
    assert send.start_time is not None and wait.end_time is not None
    window = (wait.end_time - send.start_time) / 1e9  # from the start of sending: see README
    # Less the loop lag charged to the wait (a part of the attribute, which adds the receive's).
    lag = float_attr(request, "llm_latency.event_loop.lag")
    overhead = float_attr(request, "llm_latency.network_overhead")
    assert window - 0.2 - lag - 1e-6 <= overhead <= window - 0.2 + 1e-6
    assert 0 <= overhead < SLACK
    assert 0.2 - 0.005 <= float_attr(request, "gen_ai.response.time_to_first_chunk") <= 0.2 + SLACK
    assert float_attr(request, "llm_latency.stream.max_gap") <= 0.1 + SLACK
    assert longest_gap_seen(request) >= 0.1 - 0.005

    (ttfc,) = telemetry.metric_points("gen_ai.client.operation.time_to_first_chunk")
    assert ttfc.count == 1
    assert dict(ttfc.attributes) == {"server.address": "127.0.0.1"}
    remaining = {
        p.attributes["llm_latency.ratelimit.kind"]: p.value
        for p in telemetry.metric_points("llm_latency.ratelimit.remaining")
    }
    assert remaining == {"requests": 42, "tokens": 9000}


async def test_non_streamed_response_has_no_stream_facts(
    telemetry: Telemetry, server: LLMServer
) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(server.url(), json={}) as response:
            await response.json()
    # No time to first chunk, no stream events or gaps.
    assert span_tree(telemetry.spans()) == [
        {
            "name": "POST /v1/chat/completions",
            "kind": "CLIENT",
            "attributes": {
                **request_to("POST", server.url()),
                **SERVER_HEADERS,
                "http.response.header.openai-processing-ms": ["0"],
                "http.response.status_code": 200,
                "llm_latency.network_overhead": IsFloat(ge=0),
                "llm_latency.server.processing_time": 0.0,
                "url.template": "/v1/chat/completions",
            },
            "children": NEW_CONNECTION,
        }
    ]
    assert telemetry.metric_points("gen_ai.client.operation.time_to_first_chunk") == []


async def test_unknown_route_is_named_by_method(telemetry: Telemetry, server: LLMServer) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url("/redirect"), allow_redirects=False) as response:
            await response.read()
    # No url.template either: the route is not one the plugin knows.
    assert span_tree(telemetry.spans()) == [
        {
            "name": "GET",
            "kind": "CLIENT",
            "attributes": {
                **request_to("GET", server.url("/redirect")),
                "http.response.status_code": 302,
            },
            "children": NEW_CONNECTION,
        }
    ]


async def test_rate_limited_response(telemetry: Telemetry, server: LLMServer) -> None:
    async with aiohttp.ClientSession() as session:
        headers: dict[str, Any] = {"header_retry-after-ms": 1500, "header_retry-after": 2}
        url = server.url(status=429, **headers)
        async with session.post(url, json={}) as response:
            assert response.status == 429
    # An error by its status, with the wait the server asks for; no phase failed.
    assert span_tree(telemetry.spans()) == [
        {
            "name": "POST /v1/chat/completions",
            "kind": "CLIENT",
            "attributes": {
                **request_to("POST", url),
                **SERVER_HEADERS,
                "error.type": "429",
                "http.response.header.openai-processing-ms": ["0"],
                "http.response.header.retry-after": ["2"],
                "http.response.header.retry-after-ms": ["1500"],
                "http.response.status_code": 429,
                "llm_latency.network_overhead": IsFloat(ge=0),
                "llm_latency.server.processing_time": 0.0,
                "url.template": "/v1/chat/completions",
            },
            "children": NEW_CONNECTION,
        }
    ]
    (limited,) = telemetry.metric_points("llm_latency.rate_limited")
    assert limited.value == 1
    (duration,) = telemetry.metric_points("http.client.request.duration")
    assert duration.attributes["http.response.status_code"] == 429
    assert duration.attributes["error.type"] == "429"


async def test_extra_headers_by_argument_and_environment(
    telemetry: Telemetry, server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import llm_latency

    llm_latency.uninstrument()
    monkeypatch.setenv(
        "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_RESPONSE", "X-From-Env, set-cookie"
    )
    telemetry.instrument(capture_response_headers=["x-from-arg", "Authorization"])
    async with aiohttp.ClientSession() as session:
        url = server.url(**{"header_x-from-env": "e", "header_x-from-arg": "a"})
        async with session.get(url) as response:
            await response.read()
    # Both extra headers are kept, and neither set-cookie nor authorization (asked for, but
    # never captured).
    assert span_tree(telemetry.spans()) == [
        {
            "name": "GET /v1/chat/completions",
            "kind": "CLIENT",
            "attributes": {
                **request_to("GET", url),
                **SERVER_HEADERS,
                "http.response.header.openai-processing-ms": ["0"],
                "http.response.header.x-from-arg": ["a"],
                "http.response.header.x-from-env": ["e"],
                "http.response.status_code": 200,
                "llm_latency.network_overhead": IsFloat(ge=0),
                "llm_latency.server.processing_time": 0.0,
                "url.template": "/v1/chat/completions",
            },
            "children": NEW_CONNECTION,
        }
    ]


async def test_metrics_per_phase(telemetry: Telemetry, server: LLMServer) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(3):
            async with session.get(server.url(wait=0.05)) as response:
                await response.read()
    counts = {
        p.attributes["llm_latency.phase"]: p.count
        for p in telemetry.metric_points("llm_latency.phase.duration")
    }
    # One new connection; send, wait and receive are on the spans only (test_phase_metrics.py).
    assert counts == {"connect": 1}
    (duration,) = telemetry.metric_points("http.client.request.duration")
    assert duration.count == 3
    assert max(duration.explicit_bounds) >= 120
    assert dict(duration.attributes) == {
        "http.request.method": "GET",
        "server.address": "127.0.0.1",
        "server.port": server.port,
        "http.response.status_code": 200,
    }


async def test_server_processing_time_metric(telemetry: Telemetry, server: LLMServer) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(2):
            async with session.get(server.url(wait=0.1)) as response:
                await response.read()
    (point,) = telemetry.metric_points("llm_latency.server.processing_time")
    assert point.count == 2
    assert point.sum == pytest.approx(0.2)
    assert dict(point.attributes) == {"server.address": "127.0.0.1"}


@pytest.mark.parametrize("parent", [False, True], ids=["root", "under a program span"])
async def test_the_request_duration_links_the_trace_the_server_time_does_not(
    telemetry: Telemetry, server: LLMServer, parent: bool
) -> None:
    """The request duration's exemplar is the attempt's trace; the server's time, recorded for
    the same attempt, carries none (its exemplar would cost a third of the record), also when
    the program's own span is current (the SDK takes an empty context for "the current one")."""
    tracer = telemetry.tracer_provider.get_tracer("program")
    async with aiohttp.ClientSession() as session:
        with tracer.start_as_current_span("batch") if parent else contextlib.nullcontext():
            async with session.get(server.url(wait=0.05)) as response:
                await response.read()
    (attempt,) = telemetry.attempts()
    assert attempt.context is not None
    # One collection: the SDK hands each exemplar over once.
    data = telemetry.reader.get_metrics_data()
    assert data is not None
    points = {
        metric.name: metric.data.data_points
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    duration = histogram(points["http.client.request.duration"][0])
    assert [(e.trace_id, e.span_id) for e in duration.exemplars] == [
        (attempt.context.trace_id, attempt.context.span_id)
    ]
    processing = histogram(points["llm_latency.server.processing_time"][0])
    assert processing.count == 1
    assert list(processing.exemplars) == []
