"""The observable instruments (counters, gauges, pool metrics) live as long as their meter, and
report what the live instrumentation counts.

The SDK registers an instrument once per meter: ``uninstrument()`` then ``instrument()`` with
the same meter provider gets the instruments already registered back, and the new callbacks are
dropped. Whatever is reported after a re-instrumentation must be the second instrumentation's
(its retries, 429s, reused connections, rate-limit state and pools); an ended instrumentation
reports its counters' final totals (a program's shutdown exports them after ``uninstrument()``)
and none of its gauges and pools; a dropped meter provider leaves nothing behind.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import llm_latency
from tests.conftest import Telemetry, metric_points
from tests.servers import LLMServer

#: The observable instruments llm-latency creates, and what each counts.
OBSERVABLE = (
    "llm_latency.retries",
    "llm_latency.rate_limited",
    "llm_latency.connections",
    "llm_latency.ratelimit.remaining",
    "http.client.open_connections",
    "llm_latency.pool.limit",
    "llm_latency.pool.waiting",
    "http.client.active_requests",
)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as opened:
        yield opened


async def one_instrumentation(
    session: aiohttp.ClientSession, server: LLMServer, scenario: str, *, limited: int, fails: int
) -> None:
    """``limited`` 429 answers, then one call retried by ``llm_latency.retry`` after ``fails``
    more 429s; the answers say ``limited`` requests are left in the window."""
    remaining: dict[str, Any] = {"header_x-ratelimit-remaining-requests": limited}
    for _ in range(limited):
        async with session.post(server.url(status=429, **remaining), json={}) as response:
            assert response.status == 429

    @llm_latency.retry(attempts=fails + 1, base_delay=0)
    async def call() -> None:
        url = server.url(scenario=scenario, fail=fails, retry_ms=1, **remaining)
        async with session.post(url, json={}) as response:
            response.raise_for_status()

    await call()


def values(reader: InMemoryMetricReader, name: str, **attributes: Any) -> list[float]:
    """The values of ``name``'s points (with ``attributes``) in one collection."""
    return [
        point.value
        for point in metric_points(reader, name)
        if attributes.items() <= dict(point.attributes or {}).items()
    ]


async def test_the_second_instrumentation_on_one_meter_is_the_one_reported(
    server: LLMServer,
) -> None:
    telemetry = Telemetry()
    telemetry.instrument()
    try:
        async with aiohttp.ClientSession() as first:
            await one_instrumentation(first, server, "first", limited=1, fails=1)
    finally:
        llm_latency.uninstrument()

    telemetry.instrument()
    try:
        async with aiohttp.ClientSession() as second:
            await one_instrumentation(second, server, "second", limited=2, fails=2)
            reader = telemetry.reader
            # Four 429s, two retries of a call, five attempts in all: the second's, not the
            # first's two 429s, one retry and three attempts.
            assert values(reader, "llm_latency.rate_limited") == [4]
            assert values(reader, "llm_latency.retries", **{"http.response.status_code": 429}) == [
                2
            ]
            assert sum(values(reader, "llm_latency.connections")) == 5
            assert values(
                reader,
                "llm_latency.ratelimit.remaining",
                **{"llm_latency.ratelimit.kind": "requests"},
            ) == [2]
            # The second session's pool: its connection, idle now, to the server.
            assert values(
                reader, "http.client.open_connections", **{"http.connection.state": "idle"}
            ) == [1]
    finally:
        llm_latency.uninstrument()


async def test_an_ended_instrumentation_reports_its_final_counts_and_no_live_state(
    server: LLMServer, session: aiohttp.ClientSession
) -> None:
    telemetry = Telemetry()
    telemetry.instrument()
    try:
        await one_instrumentation(session, server, "ended", limited=1, fails=1)
        assert values(telemetry.reader, "llm_latency.rate_limited") == [2]
        # Counted after that collection: what a program's shutdown (after uninstrument())
        # exports, with nothing collected in between.
        await one_instrumentation(session, server, "ended", limited=1, fails=0)
    finally:
        llm_latency.uninstrument()
    reported = {name: metric_points(telemetry.reader, name) for name in OBSERVABLE}
    final = {
        name: sorted(point.value for point in reported.pop(name))
        for name in ("llm_latency.rate_limited", "llm_latency.retries", "llm_latency.connections")
    }
    # Three 429s, one retry, five attempts (one on a new connection, four on it again).
    assert final == {
        "llm_latency.rate_limited": [3],
        "llm_latency.retries": [1],
        "llm_latency.connections": [1, 4],
    }
    # The rate-limit state and the pools are no longer watched: not reported.
    assert reported == {name: [] for name in OBSERVABLE if name not in final}


async def test_a_dropped_meter_provider_leaves_nothing(
    server: LLMServer, session: aiohttp.ClientSession
) -> None:
    gc.collect()
    before = llm_latency.live_state()["meters"]
    telemetry = Telemetry()
    for _ in range(3):
        telemetry.instrument()
        try:
            await one_instrumentation(session, server, "dropped", limited=1, fails=0)
        finally:
            llm_latency.uninstrument()
    # One meter with instruments however many instrumentations used it.
    assert llm_latency.live_state()["meters"] == before + 1
    dropped = weakref.ref(telemetry.meter_provider)
    telemetry.meter_provider.shutdown()
    telemetry.meter_provider = MeterProvider()  # the Telemetry object outlives the test
    gc.collect()
    assert dropped() is None
    assert llm_latency.live_state()["meters"] == before
