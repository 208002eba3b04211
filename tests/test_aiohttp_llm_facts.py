"""aiohttp: the LLM facts on the request span: provider headers, server processing time,
network overhead, route templates, stream statistics, and the metrics recorded with them."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.attributes import float_attr
from tests.conftest import Telemetry
from tests.servers import LLMServer

SLACK = 0.3


async def test_streamed_completion_facts(telemetry: Telemetry, server: LLMServer) -> None:
    async with aiohttp.ClientSession() as session:
        url = server.url(wait=0.2, chunks=5, gap=0.1, sse=1)
        async with session.post(url, json={"stream": True}) as response:
            lines = [line async for line in response.content]
    assert lines[-2] == b"data: [DONE]\n"
    request = telemetry.request()
    attrs = request.attributes
    assert attrs is not None
    assert request.name == "POST /v1/chat/completions"
    assert attrs["url.template"] == "/v1/chat/completions"
    assert attrs["http.response.header.x-request-id"] == ("req_test_123",)
    assert attrs["http.response.header.openai-processing-ms"] == ("200",)
    assert attrs["llm_latency.server.processing_time"] == pytest.approx(0.2)
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
    assert attrs["llm_latency.stream.events"] == 6  # five deltas and [DONE]
    assert 0.1 - 0.005 <= float_attr(request, "llm_latency.stream.max_gap") <= 0.1 + SLACK
    assert attrs["http.response.header.x-ratelimit-remaining-tokens"] == ("9000",)
    assert not any("set-cookie" in key for key in attrs)

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
    attrs = telemetry.request().attributes
    assert attrs is not None
    assert "gen_ai.response.time_to_first_chunk" not in attrs
    assert "llm_latency.stream.events" not in attrs
    assert telemetry.metric_points("gen_ai.client.operation.time_to_first_chunk") == []


async def test_unknown_route_is_named_by_method(telemetry: Telemetry, server: LLMServer) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url("/redirect"), allow_redirects=False) as response:
            await response.read()
    request = telemetry.request()
    assert request.name == "GET"
    assert request.attributes is not None
    assert "url.template" not in request.attributes


async def test_rate_limited_response(telemetry: Telemetry, server: LLMServer) -> None:
    async with aiohttp.ClientSession() as session:
        headers: dict[str, Any] = {"header_retry-after-ms": 1500, "header_retry-after": 2}
        url = server.url(status=429, **headers)
        async with session.post(url, json={}) as response:
            assert response.status == 429
    request = telemetry.request()
    attrs = request.attributes
    assert attrs is not None
    assert attrs["error.type"] == "429"
    assert attrs["http.response.header.retry-after-ms"] == ("1500",)
    assert attrs["http.response.header.retry-after"] == ("2",)
    assert "llm_latency.failed_phase" not in attrs
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
    attrs = telemetry.request().attributes
    assert attrs is not None
    assert attrs["http.response.header.x-from-env"] == ("e",)
    assert attrs["http.response.header.x-from-arg"] == ("a",)
    assert not any("cookie" in key or "authorization" in key for key in attrs)


async def test_metrics_per_phase(telemetry: Telemetry, server: LLMServer) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(3):
            async with session.get(server.url(wait=0.05)) as response:
                await response.read()
    counts = {
        p.attributes["llm_latency.phase"]: p.count
        for p in telemetry.metric_points("llm_latency.phase.duration")
    }
    assert counts == {"connect": 1, "send": 3, "wait": 3, "receive": 3}
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
