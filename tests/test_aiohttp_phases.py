"""aiohttp: each phase is present when it happens, absent when not, and as long as the delay
the test injects into it (with tolerances for a busy 2-core machine)."""

from __future__ import annotations

import asyncio
import ssl

import aiohttp
import pytest

from llm_latency.testing import HandshakeDelay, LocalDNS
from tests.attributes import attributes
from tests.checks import SLACK, assert_about, assert_tiles, served_within
from tests.conftest import Telemetry, seconds
from tests.servers import LLMServer
from tests.span_tree import phase_nodes, span_tree
from tests.test_retries import LAG, redirect_hops, served


async def test_fresh_connection_has_dns_connect_send_wait_receive(
    telemetry: Telemetry, server: LLMServer, dns: LocalDNS
) -> None:
    dns.resolver.delay = 0.2
    url = server.url(host="api.llm.test", wait=0.3, chunks=4, gap=0.1)
    bodies: list[bytes] = []

    async def send() -> None:
        resolver = aiohttp.AsyncResolver(nameservers=[dns.nameserver])
        connector = aiohttp.TCPConnector(resolver=resolver)
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.post(url, json={"model": "m"}) as response:
                bodies.append(await response.read())

    request = await served_within(telemetry, send, wait=0.3, receive=0.3, total=0.8)
    assert bodies[-1].startswith(b"chunk0")
    phases = telemetry.phases(request)
    assert set(phases) == {"dns", "connect", "send", "wait", "receive"}
    assert_about(seconds(phases["dns"]), 0.2)
    assert seconds(phases["connect"]) < SLACK
    assert span_tree(telemetry.spans()) == [
        {
            "name": "POST /v1/chat/completions",
            "kind": "CLIENT",
            "attributes": {
                **served("POST", url, reused=False, processing=0.3, host="api.llm.test"),
                **LAG,
                "url.full": url,  # span_tree stands PORT in for loopback addresses' ports only
            },
            "children": phase_nodes(
                "dns", "connect", "send", "wait", "receive", host="api.llm.test"
            ),
        }
    ]
    assert_tiles(telemetry)


async def test_tls_phase_is_separate_from_tcp(
    telemetry: Telemetry, tls_server: LLMServer, client_ssl: ssl.SSLContext
) -> None:
    async with HandshakeDelay(tls_server.port, delay=0.25) as proxy:
        connector = aiohttp.TCPConnector(ssl=client_ssl)
        async with aiohttp.ClientSession(connector=connector) as session:
            url = f"https://localhost:{proxy.port}/v1/chat/completions"
            async with session.post(url, json={}) as response:
                await response.json()
    request = telemetry.request()
    phases = telemetry.phases(request)
    assert {"connect", "tls", "send", "wait", "receive"} <= set(phases)
    assert_about(seconds(phases["tls"]), 0.25)
    assert seconds(phases["connect"]) < 0.2
    assert_tiles(telemetry)


async def test_pooled_connection_skips_dns_connect_tls(
    telemetry: Telemetry, tls_server: LLMServer, client_ssl: ssl.SSLContext
) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ssl)) as session:
        for _ in range(2):
            async with session.post(tls_server.url(host="localhost"), json={}) as response:
                await response.read()
    first, second = telemetry.requests()
    assert {"dns", "connect", "tls"} <= set(telemetry.phases(first))
    assert set(telemetry.phases(second)) == {"send", "wait", "receive"}
    assert attributes(first)["llm_latency.connection.reused"] is False
    assert attributes(second)["llm_latency.connection.reused"] is True
    reused = {
        p.attributes["llm_latency.connection.reused"]: p.value
        for p in telemetry.metric_points("llm_latency.connections")
    }
    assert reused == {False: 1, True: 1}


async def test_dns_cache_hit_has_no_dns_phase(
    telemetry: Telemetry, server: LLMServer, dns: LocalDNS
) -> None:
    dns.resolver.delay = 0.05
    resolver = aiohttp.AsyncResolver(nameservers=[dns.nameserver])
    connector = aiohttp.TCPConnector(resolver=resolver, force_close=True, use_dns_cache=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        lookups = []
        for _ in range(2):
            async with session.get(server.url(host="cache.llm.test")) as response:
                await response.read()
            lookups.append(len(dns.resolver.queries))
    first, second = telemetry.requests()
    assert "dns" in telemetry.phases(first)
    assert "dns" not in telemetry.phases(second)
    assert "connect" in telemetry.phases(second)
    assert lookups[0] > 0
    assert lookups[1] == lookups[0]  # the second request asked the DNS server nothing


async def test_pool_limit_queues_requests(telemetry: Telemetry, server: LLMServer) -> None:
    connector = aiohttp.TCPConnector(limit_per_host=1)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            async with session.get(server.url(wait=0.2)) as response:
                await response.read()

        await asyncio.gather(one(), one(), one())
    requests = telemetry.requests()
    assert len(requests) == 3
    queued = sorted(seconds(p["queue"]) for p in map(telemetry.phases, requests) if "queue" in p)
    # The first request takes the only connection; the others wait about one and two
    # server delays for it.
    assert len(queued) == 2
    assert_about(queued[0], 0.2)
    assert_about(queued[1], 0.4)
    assert_tiles(telemetry)


async def test_ip_literal_has_no_dns_phase(telemetry: Telemetry, server: LLMServer) -> None:
    async with aiohttp.ClientSession() as session, session.get(server.url()) as response:
        await response.read()
    assert set(telemetry.phases(telemetry.request())) == {"connect", "send", "wait", "receive"}


async def test_large_request_body_send_phase(telemetry: Telemetry, server: LLMServer) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(server.url(), data=b"x" * 4_000_000) as response:
            await response.read()
    phases = telemetry.phases(telemetry.request())
    assert {"send", "wait", "receive"} <= set(phases)
    assert_tiles(telemetry)


async def test_redirect_hops_are_separate_attempts(telemetry: Telemetry, server: LLMServer) -> None:
    tracer = telemetry.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("program"):
        async with aiohttp.ClientSession() as session:
            async with session.get(server.url("/redirect")) as response:
                await response.read()
                assert response.status == 200
    # Both hops under the program's span, the second a resend on the same connection.
    assert span_tree(telemetry.spans()) == [
        {
            "name": "program",
            "kind": "INTERNAL",
            "attributes": {},
            "children": redirect_hops(server, LAG),
        }
    ]
    hop, final = telemetry.requests()  # and the second links to the first
    assert hop.context is not None
    assert [link.context.span_id for link in final.links] == [hop.context.span_id]


@pytest.mark.parametrize("capture_all", [False, True], ids=["known methods", "capture all"])
async def test_unknown_methods_follow_the_semantic_conventions(
    telemetry: Telemetry, server: LLMServer, monkeypatch: pytest.MonkeyPatch, capture_all: bool
) -> None:
    """An unknown method is ``_OTHER`` (the span is named ``HTTP``, the original kept),
    unless OTEL_PYTHON_INSTRUMENTATION_HTTP_CAPTURE_ALL_METHODS keeps it; metrics agree."""
    if capture_all:
        monkeypatch.setenv("OTEL_PYTHON_INSTRUMENTATION_HTTP_CAPTURE_ALL_METHODS", "true")
    async with aiohttp.ClientSession() as session:
        async with session.request("PURGE", server.url()) as response:
            await response.read()
    request = telemetry.request()
    method = "PURGE" if capture_all else "_OTHER"
    assert request.name == (
        "PURGE /v1/chat/completions" if capture_all else "HTTP /v1/chat/completions"
    )
    assert attributes(request)["http.request.method"] == method
    assert attributes(request).get("http.request.method_original") == (
        None if capture_all else "PURGE"
    )
    (point,) = telemetry.metric_points("http.client.request.duration")
    assert point.attributes["http.request.method"] == method
