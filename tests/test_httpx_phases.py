"""httpx and httpx2 (sync and async): the same phase breakdown as for aiohttp, against delays
injected by loopback peers, and the span ending when the body is read or closed."""

from __future__ import annotations

import asyncio
import os
import ssl
from typing import Any

import pytest
from opentelemetry.trace import StatusCode

import llm_latency
from llm_latency.testing import HandshakeDelay
from tests.attributes import attributes, float_attr, longest_gap_seen
from tests.checks import EARLY, SLACK, TRIES, assert_about, assert_tiles, served_within
from tests.conftest import Telemetry, seconds
from tests.cpu_waits import collector_pauses, machine_waits
from tests.httpx_clients import KINDS, Client
from tests.servers import LLMServer
from tests.span_tree import phase_nodes, span_tree
from tests.test_retries import LAG, served

pytestmark = pytest.mark.parametrize("kind", KINDS)


async def test_fresh_connection_phases(telemetry: Telemetry, server: LLMServer, kind: str) -> None:
    url = server.url(host="localhost", wait=0.3, chunks=4, gap=0.1)
    bodies: list[bytes] = []

    async def send() -> None:
        async with Client(kind) as client:
            bodies.append((await client.request("POST", url, json={"m": 1})).body)

    request = await served_within(telemetry, send, wait=0.3, receive=0.3, total=0.6)
    assert bodies[-1].startswith(b"chunk0")
    phases = telemetry.phases(request)
    # "localhost" resolves from /etc/hosts: quick, but a lookup all the same.
    assert set(phases) == {"dns", "connect", "send", "wait", "receive"}
    assert attributes(request)["server.port"] == server.port
    assert span_tree(telemetry.spans()) == [
        {
            "name": "POST /v1/chat/completions",
            "kind": "CLIENT",
            "attributes": {
                **served("POST", url, reused=False, processing=0.3, host="localhost"),
                **(LAG if kind.endswith("async") else {}),
            },
            "children": phase_nodes("dns", "connect", "send", "wait", "receive", host="localhost"),
        }
    ]
    assert_tiles(telemetry)
    assert "traceparent" in server.requests[-1]["headers"]


async def test_pooled_and_ip_literal(telemetry: Telemetry, server: LLMServer, kind: str) -> None:
    async with Client(kind) as client:
        for _ in range(2):
            await client.request("GET", server.url())
    first, second = telemetry.requests()
    assert set(telemetry.phases(first)) == {"connect", "send", "wait", "receive"}
    assert set(telemetry.phases(second)) == {"send", "wait", "receive"}
    assert attributes(second)["llm_latency.connection.reused"] is True


async def test_tls_phase(
    telemetry: Telemetry, tls_server: LLMServer, client_ssl: ssl.SSLContext, kind: str
) -> None:
    async with HandshakeDelay(tls_server.port, delay=0.25) as proxy:
        async with Client(kind, verify=client_ssl) as client:
            url = f"https://localhost:{proxy.port}/v1/chat/completions"
            result = await client.request("POST", url, json={})
    assert result.status == 200
    phases = telemetry.phases(telemetry.request())
    assert {"dns", "connect", "tls", "send", "wait", "receive"} == set(phases)
    assert_about(seconds(phases["tls"]), 0.25)
    assert seconds(phases["connect"]) < 0.2
    assert_tiles(telemetry)


async def test_pool_limit_queues(telemetry: Telemetry, server: LLMServer, kind: str) -> None:
    """Three requests through one connection: the second and third queue for one and two of
    the server's 0.2 s answers. A run whose queues are longer than that by no more than what
    the machine measurably took meanwhile (this process's run-queue waits: a sync client's
    thread woken late takes the connection late; the collector's pauses) runs again, up to
    :data:`TRIES` times; any other miss fails at once."""
    for _ in range(TRIES):
        telemetry.exporter.clear()  # a run again: only its own spans
        with machine_waits(os.getpid()) as waited, collector_pauses() as collected:
            async with Client(kind, limits=_limits(kind, max_connections=1)) as client:
                await asyncio.gather(
                    *(client.request("GET", server.url(wait=0.2)) for _ in range(3))
                )
        requests = telemetry.requests()
        assert len(requests) == 3
        phases = map(telemetry.phases, requests)
        queued = sorted(seconds(p["queue"]) for p in phases if "queue" in p)
        assert len(queued) == 2
        assert queued[0] >= 0.2 - EARLY and queued[1] >= 0.4 - EARLY, queued
        late = max(queued[0] - (0.2 + SLACK), queued[1] - (0.4 + SLACK))
        if late <= 0 or late > waited.peers + collected.seconds:
            break
    assert_about(queued[0], 0.2)
    assert_about(queued[1], 0.4)
    assert_tiles(telemetry)


async def test_streamed_completion(telemetry: Telemetry, server: LLMServer, kind: str) -> None:
    lines: list[str] = []

    async def send() -> None:
        async with Client(kind) as client:
            result = await client.request(
                "POST", server.url(wait=0.2, chunks=5, gap=0.1, sse=1), stream=True, json={}
            )
        lines[:] = result.lines

    request = await served_within(telemetry, send, wait=0.2, receive=0.4)
    assert lines[-2] == "data: [DONE]"
    assert 0.2 - 0.005 <= float_attr(request, "gen_ai.response.time_to_first_chunk") <= 0.2 + SLACK
    assert attributes(request)["llm_latency.stream.events"] == 6
    assert float_attr(request, "llm_latency.stream.max_gap") <= 0.1 + SLACK
    assert longest_gap_seen(request) >= 0.1 - 0.005
    assert float_attr(request, "llm_latency.network_overhead") < SLACK


async def test_closed_early(telemetry: Telemetry, server: LLMServer, kind: str) -> None:
    async with Client(kind) as client:
        result = await client.request("GET", server.url(chunks=20, gap=0.1, sse=1), lines=1)
    assert len(result.lines) == 1
    request = telemetry.request()
    assert seconds(request) < 1.0  # not the 1.9 s of the whole stream
    assert request.status.status_code is StatusCode.UNSET


async def test_program_trace_callback_still_called(
    telemetry: Telemetry, server: LLMServer, kind: str
) -> None:
    seen: list[str] = []

    async def async_trace(name: str, info: dict[str, Any]) -> None:
        seen.append(name)

    def sync_trace(name: str, info: dict[str, Any]) -> None:
        seen.append(name)

    trace = async_trace if kind.endswith("async") else sync_trace

    async with Client(kind) as client:
        for _ in range(2):  # the second send must not chain to our first callback
            await client.request("GET", server.url(), extensions={"trace": trace})
    assert seen.count("http11.receive_response_headers.complete") == 2
    assert len(telemetry.requests()) == 2


async def test_client_and_transport_made_before_instrument(server: LLMServer, kind: str) -> None:
    module: Any = __import__(kind.split("-")[0])
    transport_class = module.AsyncHTTPTransport if kind.endswith("async") else module.HTTPTransport
    client = Client(kind, transport=transport_class(retries=0))
    telemetry = Telemetry()
    telemetry.instrument()
    try:
        await client.request("GET", server.url())
    finally:
        llm_latency.uninstrument()
        await client.close()
    assert len(telemetry.requests()) == 1


def _limits(kind: str, **kwargs: Any) -> Any:
    module: Any = __import__(kind.split("-")[0])
    return module.Limits(**kwargs)
