"""The connection pool, visible: open connections (active, idle), requests waiting, the pool's
limit, requests in flight and connection lifetimes, read from real pools under a burst.

Each client gets a pool of 2 connections to one loopback server and 6 concurrent requests that
each take 0.3 s there, so 4 of them wait for a connection. The metrics are collected from
another thread all along, as the SDK's periodic reader does.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
import httpx2
import pytest
import requests
from requests.adapters import HTTPAdapter

import llm_latency
from tests.checks import histogram, int_value
from tests.conftest import Telemetry
from tests.httpx_clients import KINDS, Client
from tests.servers import LLMServer

LIMIT = 2
CONCURRENCY = 6
SERVER_WAIT = 0.3


@dataclass
class Sample:
    """One collection, summed over hosts (the tests use one)."""

    active: int = 0
    idle: int = 0
    waiting: int = 0
    requests: int = 0
    limit: int | None = None
    closed_connections: int = 0
    lifetime_sum: float = 0.0


def sample(telemetry: Telemetry) -> Sample:
    data = telemetry.reader.get_metrics_data()
    found = Sample()
    if data is None:
        return found
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    attributes = dict(point.attributes or {})
                    if metric.name == "http.client.open_connections":
                        if attributes["http.connection.state"] == "active":
                            found.active += int_value(point)
                        else:
                            found.idle += int_value(point)
                    elif metric.name == "llm_latency.pool.waiting":
                        found.waiting += int_value(point)
                    elif metric.name == "http.client.active_requests":
                        found.requests += int_value(point)
                    elif metric.name == "llm_latency.pool.limit":
                        found.limit = (found.limit or 0) + int_value(point)
                    elif metric.name == "http.client.connection.duration":
                        found.closed_connections += histogram(point).count
                        found.lifetime_sum += histogram(point).sum
    return found


@dataclass
class Sampler:
    """Collects from a thread of its own until stopped."""

    telemetry: Telemetry
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(sample(self.telemetry))
            self._stop.wait(0.02)


@contextmanager
def sampling(telemetry: Telemetry) -> Iterator[Sampler]:
    sampler = Sampler(telemetry)
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    try:
        yield sampler
    finally:
        sampler._stop.set()
        thread.join()


def check_burst(sampler: Sampler) -> None:
    """The pool filled and requests queued behind it, and never went past its limit."""
    assert sampler.samples, "nothing was collected during the burst"
    for seen in sampler.samples:
        assert seen.active <= LIMIT, seen
        assert seen.active + seen.idle <= LIMIT, seen
        assert seen.waiting <= seen.requests, seen
    assert any(s.active == LIMIT and s.waiting > 0 for s in sampler.samples), sampler.samples
    assert max(s.requests for s in sampler.samples) > LIMIT
    assert all(s.limit == LIMIT for s in sampler.samples if s.active), sampler.samples


def check_after_burst(after: Sample) -> None:
    """Every request is done: the connections stay open, idle, for the next ones."""
    assert (after.active, after.idle, after.waiting, after.requests) == (0, LIMIT, 0, 0), after
    assert after.limit == LIMIT


def check_closed(closed: Sample) -> None:
    """The session closed its connections: every count is back to zero, and each
    connection's lifetime (at least the burst's length) was recorded."""
    assert (closed.active, closed.idle, closed.waiting, closed.requests) == (0, 0, 0, 0), closed
    assert closed.limit is None
    assert closed.closed_connections == LIMIT
    assert closed.lifetime_sum >= LIMIT * SERVER_WAIT


async def burst(one: Callable[[], Awaitable[Any]]) -> list[Any]:
    return await asyncio.gather(*(one() for _ in range(CONCURRENCY)))


async def test_aiohttp_pool(telemetry: Telemetry, server: LLMServer) -> None:
    telemetry.instrument()
    url = server.url(wait=SERVER_WAIT)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit_per_host=LIMIT))

    async def one() -> bytes:
        async with session.post(url, json={}) as response:
            return await response.read()

    with sampling(telemetry) as sampler:
        await burst(one)
    check_burst(sampler)
    check_after_burst(sample(telemetry))
    await session.close()
    await asyncio.sleep(0.05)  # connection_lost runs on the next loop iterations
    check_closed(sample(telemetry))


@pytest.mark.parametrize("kind", KINDS)
async def test_httpx_pool(telemetry: Telemetry, server: LLMServer, kind: str) -> None:
    telemetry.instrument()
    url = server.url(wait=SERVER_WAIT)
    module = httpx2 if kind.startswith("httpx2") else httpx
    client = Client(kind, limits=module.Limits(max_connections=LIMIT))

    with sampling(telemetry) as sampler:
        await burst(lambda: client.request("POST", url, json={}))
    check_burst(sampler)
    check_after_burst(sample(telemetry))
    await client.close()
    check_closed(sample(telemetry))


async def test_requests_pool(telemetry: Telemetry, server: LLMServer) -> None:
    telemetry.instrument()
    url = server.url(wait=SERVER_WAIT)
    session = requests.Session()
    # pool_block: the pool's size is a limit (by default urllib3 opens more and drops them).
    session.mount("http://", HTTPAdapter(pool_maxsize=LIMIT, pool_block=True))

    def one() -> int:
        with session.post(url, json={}) as response:
            return response.status_code

    with sampling(telemetry) as sampler:
        statuses = await burst(lambda: asyncio.to_thread(one))
    assert statuses == [200] * CONCURRENCY
    check_burst(sampler)
    check_after_burst(sample(telemetry))
    session.close()
    # urllib3 closes a pool's connections when the pool is collected (PoolManager.clear()
    # drops it); until then they are open, and counted.
    gc.collect()
    check_closed(sample(telemetry))


async def test_non_blocking_urllib3_pool_reports_no_limit(
    telemetry: Telemetry, server: LLMServer
) -> None:
    """requests' default pool opens a connection whenever none is free: its size bounds the
    kept-alive connections, not the open ones, so it is not reported as a limit."""
    telemetry.instrument()
    url = server.url(wait=SERVER_WAIT)
    with requests.Session() as session:
        session.mount("http://", HTTPAdapter(pool_maxsize=1))
        with sampling(telemetry) as sampler:
            await burst(lambda: asyncio.to_thread(session.post, url, json={}))
        assert max(s.active for s in sampler.samples) > 1
        assert all(s.waiting == 0 and s.limit is None for s in sampler.samples)
        after = sample(telemetry)
        # One kept; the others were closed when the full pool refused them.
        assert (after.active, after.idle) == (0, 1)
        assert after.closed_connections == CONCURRENCY - 1


async def test_limits_of_pools_to_one_host_add_up(telemetry: Telemetry, server: LLMServer) -> None:
    telemetry.instrument()
    url = server.url()
    sessions = [
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=10, limit_per_host=3)),
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4)),
    ]
    try:
        for session in sessions:
            async with session.post(url, json={}) as response:
                await response.read()
        seen = sample(telemetry)
        assert seen.limit == 3 + 4
        assert (seen.active, seen.idle) == (0, 2)
        unlimited = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        async with unlimited.post(url, json={}) as response:
            await response.read()
        await unlimited.close()
        await asyncio.sleep(0.05)
        assert sample(telemetry).limit == 3 + 4  # a closed pool no longer counts
        unlimited = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        async with unlimited.post(url, json={}) as response:
            await response.read()
        assert sample(telemetry).limit is None  # one pool without a limit: no limit at all
        await unlimited.close()
    finally:
        for session in sessions:
            await session.close()


async def test_uninstrument_stops_reading_pools(telemetry: Telemetry, server: LLMServer) -> None:
    telemetry.instrument()
    async with aiohttp.ClientSession() as session:
        async with session.post(server.url(), json={}) as response:
            await response.read()
        assert sample(telemetry).idle == 1
        llm_latency.uninstrument()
        assert sample(telemetry).idle == 0
