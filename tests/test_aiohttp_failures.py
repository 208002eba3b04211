"""aiohttp failures: the program sees exactly what it sees uninstrumented; the failed phase span
ends ERROR with ``error.type`` and the exception event; no span is left open."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from llm_latency.testing import LocalDNS
from tests.attributes import attributes, int_attr
from tests.bad_servers import BlackHole
from tests.checks import assert_failed, compare, full_backlog
from tests.conftest import Telemetry
from tests.servers import LLMServer, unused_port


def session(**kwargs: Any) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(**kwargs)


@contextlib.asynccontextmanager
async def dns_session(dns: LocalDNS, **kwargs: Any) -> AsyncIterator[aiohttp.ClientSession]:
    """A session resolving through the test DNS server, with no DNS cache."""
    resolver = aiohttp.AsyncResolver(nameservers=[dns.nameserver])
    try:
        connector = aiohttp.TCPConnector(resolver=resolver, use_dns_cache=False)
        async with aiohttp.ClientSession(connector=connector, **kwargs) as s:
            yield s
    finally:
        await resolver.close()


async def test_dns_failure(telemetry: Telemetry, dns: LocalDNS) -> None:
    async def scenario() -> None:
        async with dns_session(dns) as s:
            await s.get("http://no-such-host.invalid/v1/models")

    outcome = await compare(telemetry, scenario)
    assert outcome.kind is aiohttp.ClientConnectorDNSError
    assert_failed(telemetry, "dns", "ClientConnectorDNSError")


async def test_dns_timeout(telemetry: Telemetry, dns: LocalDNS) -> None:
    dns.resolver.delay = 1.0

    async def scenario() -> None:
        async with dns_session(dns, timeout=aiohttp.ClientTimeout(total=0.2)) as s:
            await s.get("http://slow.llm.test:9/v1/models")

    outcome = await compare(telemetry, scenario)
    assert outcome.kind is TimeoutError
    assert_failed(telemetry, "dns", "TimeoutError")


async def test_connection_refused(telemetry: Telemetry) -> None:
    port = unused_port()

    async def scenario() -> None:
        async with session() as s:
            await s.get(f"http://127.0.0.1:{port}/v1/models")

    outcome = await compare(telemetry, scenario)
    assert outcome.kind is aiohttp.ClientConnectorError
    assert_failed(telemetry, "connect", "ClientConnectorError")


async def test_connect_timeout(telemetry: Telemetry) -> None:
    with full_backlog() as port:

        async def scenario() -> None:
            timeout = aiohttp.ClientTimeout(sock_connect=0.2)
            async with session(timeout=timeout) as s:
                await s.get(f"http://127.0.0.1:{port}/v1/models")

        outcome = await compare(telemetry, scenario)
    assert outcome.kind is aiohttp.ConnectionTimeoutError
    assert_failed(telemetry, "connect", "ConnectionTimeoutError")


async def test_tls_verification_failure(telemetry: Telemetry, tls_server: LLMServer) -> None:
    async def scenario() -> None:
        async with session() as s:  # the default context does not trust the test CA
            await s.get(tls_server.url(host="localhost"))

    outcome = await compare(telemetry, scenario)
    assert outcome.kind is aiohttp.ClientConnectorCertificateError
    assert_failed(telemetry, "tls", "ClientConnectorCertificateError")


async def test_tls_handshake_timeout(telemetry: Telemetry, client_ssl: ssl.SSLContext) -> None:
    silent = BlackHole(read=False)
    try:

        async def scenario() -> None:
            timeout = aiohttp.ClientTimeout(sock_connect=0.2)
            connector = aiohttp.TCPConnector(ssl=client_ssl)
            async with session(timeout=timeout, connector=connector) as s:
                await s.get(f"https://localhost:{silent.port}/v1/models")

        outcome = await compare(telemetry, scenario)
    finally:
        silent.close()
    assert outcome.kind is aiohttp.ConnectionTimeoutError
    assert_failed(telemetry, "tls", "ConnectionTimeoutError")


async def test_total_timeout_while_waiting(telemetry: Telemetry, server: LLMServer) -> None:
    async def scenario() -> None:
        async with session(timeout=aiohttp.ClientTimeout(total=0.2)) as s:
            await s.post(server.url(wait=1.0), json={})

    outcome = await compare(telemetry, scenario)
    assert outcome.kind is TimeoutError
    assert_failed(telemetry, "wait", "TimeoutError")


async def test_sock_read_timeout_while_waiting(telemetry: Telemetry, server: LLMServer) -> None:
    async def scenario() -> None:
        async with session(timeout=aiohttp.ClientTimeout(sock_read=0.2)) as s:
            await s.post(server.url(wait=1.0), json={})

    outcome = await compare(telemetry, scenario)
    assert outcome.kind is aiohttp.SocketTimeoutError
    assert_failed(telemetry, "wait", "SocketTimeoutError")


async def test_sock_read_timeout_mid_body(telemetry: Telemetry, server: LLMServer) -> None:
    async def scenario() -> None:
        async with session(timeout=aiohttp.ClientTimeout(sock_read=0.2)) as s:
            async with s.get(server.url(chunks=3, gap=1.0, sse=1)) as response:
                await response.read()

    outcome = await compare(telemetry, scenario)
    assert outcome.kind is aiohttp.SocketTimeoutError
    assert_failed(telemetry, "receive", "SocketTimeoutError")


async def test_queue_timeout(telemetry: Telemetry, server: LLMServer) -> None:
    async def scenario() -> None:
        connector = aiohttp.TCPConnector(limit=1)
        async with session(connector=connector) as s:
            holder = await s.get(server.url(chunks=3, gap=0.5))
            try:
                await s.get(server.url(), timeout=aiohttp.ClientTimeout(connect=0.2))
            finally:
                holder.close()

    outcome = await compare(telemetry, scenario)
    assert outcome.kind is aiohttp.ConnectionTimeoutError
    failed = [r for r in telemetry.requests() if r.attributes and "error.type" in r.attributes]
    assert len(failed) == 1
    assert attributes(failed[0])["llm_latency.failed_phase"] == "queue"


@pytest.mark.parametrize("sse", [0, 1], ids=["body", "stream"])
async def test_server_resets_mid_body(telemetry: Telemetry, server: LLMServer, sse: int) -> None:
    async def scenario() -> None:
        async with session() as s, s.get(server.url(chunks=5, gap=0.05, reset=2, sse=sse)) as r:
            await r.read()

    outcome = await compare(telemetry, scenario)
    assert outcome.kind is aiohttp.ClientPayloadError
    assert_failed(telemetry, "receive", "ClientPayloadError")


CANCEL_POINTS = {
    # phase -> (the request, and the delay after which the task is cancelled)
    "dns": ("http://slow.llm.test:9/v1/models", 0.15),
    "wait": ("{server}?wait=1", 0.15),
    "receive": ("{server}?chunks=10&gap=0.1", 0.25),
}


@pytest.mark.parametrize("phase", sorted(CANCEL_POINTS))
async def test_cancellation(
    telemetry: Telemetry, server: LLMServer, dns: LocalDNS, phase: str
) -> None:
    dns.resolver.delay = 1.0
    url_template, after = CANCEL_POINTS[phase]
    url = url_template.format(server=server.url())

    async def request() -> None:
        async with dns_session(dns) as s, s.get(url) as response:
            await response.read()

    async def scenario() -> None:
        task = asyncio.ensure_future(request())
        await asyncio.sleep(after)
        task.cancel()
        await task

    outcome = await compare(telemetry, scenario)
    assert outcome.kind is asyncio.CancelledError
    assert_failed(telemetry, phase, "CancelledError")


async def test_cancellation_in_tls(telemetry: Telemetry, client_ssl: ssl.SSLContext) -> None:
    silent = BlackHole(read=False)
    try:

        async def request() -> None:
            async with session(connector=aiohttp.TCPConnector(ssl=client_ssl)) as s:
                await s.get(f"https://localhost:{silent.port}/")

        async def scenario() -> None:
            task = asyncio.ensure_future(request())
            await asyncio.sleep(0.15)
            task.cancel()
            await task

        outcome = await compare(telemetry, scenario)
    finally:
        silent.close()
    assert outcome.kind is asyncio.CancelledError
    assert_failed(telemetry, "tls", "CancelledError")


async def test_total_timeout_mid_stream(telemetry: Telemetry, server: LLMServer) -> None:
    async def scenario() -> None:
        async with session(timeout=aiohttp.ClientTimeout(total=0.3)) as s:
            async with s.get(server.url(chunks=10, gap=0.1, sse=1)) as response:
                async for _ in response.content:
                    pass

    outcome = await compare(telemetry, scenario)
    assert outcome.kind is TimeoutError
    assert_failed(telemetry, "receive", "TimeoutError")
    request = telemetry.request()
    assert 1 <= int_attr(request, "llm_latency.stream.events") < 10
