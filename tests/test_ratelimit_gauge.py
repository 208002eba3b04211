"""The rate-limit gauge reports a value only while it is fresh: until the provider's window
resets, and never longer than RATELIMIT_MAX_AGE, so an idle or dead program's last value is not
reported forever (it would win a ``min`` over the live instances)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from opentelemetry.metrics import CallbackOptions

from llm_latency.headers import parse_duration
from llm_latency.metrics import _FreshValues
from tests.conftest import Telemetry
from tests.servers import LLMServer


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("6m0s", 360.0), ("1s", 1.0), ("20ms", 0.02), ("1h2m3.5s", 3723.5), ("2.5", 2.5),
     ("", None), ("soon", None), ("5x", None), ("-1", None), (None, None)],
)  # fmt: skip
def test_reset_durations(text: str | None, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


def test_a_value_is_reported_until_it_goes_stale() -> None:
    now = [100.0]
    values = _FreshValues(clock=lambda: now[0])
    key = (("server.address", "api.test"), ("llm_latency.ratelimit.kind", "requests"))
    values.set_fresh(key, 42, for_seconds=10)

    def observed() -> list[Any]:
        return [o.value for o in values.observe(CallbackOptions())]

    assert observed() == [42]
    now[0] = 109.9
    assert observed() == [42]
    now[0] = 110.0
    assert observed() == []
    values.set_fresh(key, 7, for_seconds=10)  # a new response refreshes it
    assert observed() == [7]


def remaining(telemetry: Telemetry) -> list[float]:
    return [p.value for p in telemetry.metric_points("llm_latency.ratelimit.remaining")
            if p.attributes["llm_latency.ratelimit.kind"] == "requests"]  # fmt: skip


async def test_the_gauge_stops_when_the_providers_window_resets(
    telemetry: Telemetry, server: LLMServer
) -> None:
    url = server.url(**{"header_x-ratelimit-reset-requests": "150ms"})
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        await response.read()
    assert remaining(telemetry) == [42]
    await asyncio.sleep(0.4)
    assert remaining(telemetry) == []
