"""Us or them: ``diagnose()`` compares the program's calls to a host with the probe's at the
same time (``llm-latency watch``'s spans), and says which side is slow, with both numbers.

Both sides are measured for real against a mock server on loopback: the program's calls with
llm-latency's instrumentation, the probe's with the monitor's own probe. The probe's baseline is
measured the same way, then placed ten minutes earlier, as a monitor running all along would
have recorded it.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llm_latency import diagnose
from llm_latency.cli.monitor import probe_once
from llm_latency.cli.monitor_config import INFERENCE, parse_config
from llm_latency.cli.monitor_export import Telemetry, probe_telemetry
from llm_latency.diagnosis import Call, as_calls, claims
from llm_latency.diagnosis.claims import over_claimed
from llm_latency.diagnosis.us_or_them import SAME_TIME, is_probe
from llm_latency.testing import Profile, running
from tests.scenarios.peers import in_thread

PROGRAM_BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
TEN_MINUTES_NS = 600 * 10**9
#: What the test adds to the server's time to first byte when it makes the provider slow (s).
SLOW_TTFB = 0.6
#: How long the program blocks its own loop while its call waits (s).
BLOCK = 0.3


@pytest.fixture
def exported() -> Iterator[tuple[Telemetry, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    with probe_telemetry("test-us-or-them") as telemetry:
        telemetry.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        yield telemetry, exporter


async def _probe(telemetry: Telemetry, url: str, times: int) -> None:
    config = parse_config(
        {
            "monitor": {"min_interval": 1},
            "endpoint": [{"name": "here", "url": url, "provider": "openai-compatible",
                          "every": 1, "kinds": [INFERENCE]}],
        }
    )  # fmt: skip
    (endpoint,) = config.endpoints
    for _ in range(times):
        result = await probe_once(endpoint, INFERENCE, telemetry, timeout=30)
        assert result.outcome.up, result.outcome


async def _program(url: str, calls: int, limit: int) -> None:
    connector = aiohttp.TCPConnector(limit=limit)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            async with session.post(url, json=PROGRAM_BODY) as response:
                await response.read()

        await asyncio.gather(*(one() for _ in range(calls)))


def _earlier(calls: list[Call]) -> list[Call]:
    """The probe's calls, ten minutes earlier."""
    return [
        replace(call, start_ns=call.start_ns - TEN_MINUTES_NS,
                attempts=[replace(a, start_ns=a.start_ns - TEN_MINUTES_NS) for a in call.attempts])
        for call in calls
    ]  # fmt: skip


def _seconds(text: str) -> list[float]:
    found = re.findall(r"(\d+(?:\.\d+)?) (ms|s)\b", text)
    return [float(n) / (1000 if unit == "ms" else 1) for n, unit in found]


async def test_the_program_slow_and_the_probe_fast_gives_the_program(
    exported: tuple[Telemetry, InMemorySpanExporter],
) -> None:
    telemetry, exporter = exported
    async with running(Profile(ttfb=0.1, tokens=2, tokens_per_second=200)) as server:
        await _probe(telemetry, server.url("/v1"), 2)
        # eight calls at once on a pool of one connection: each waits for the ones before it
        await _program(server.url(), calls=8, limit=1)
        await _probe(telemetry, server.url("/v1"), 1)
    findings = diagnose(exporter.get_finished_spans())
    (found,) = [f for f in findings if f.rule == "us-or-them"]
    assert found.cause.startswith("the program is slow, not 127.0.0.1: its calls took ")
    assert "the inference probe of 127.0.0.1 took " in found.cause
    program_p50, probe_p50, queue_p50 = _seconds(found.cause)[:3]
    # both numbers: the program's first byte includes its queue behind the calls before it
    assert program_p50 >= 2 * 0.1
    assert probe_p50 < program_p50 / 2
    assert "waiting for a pooled connection" in found.cause
    assert queue_p50 >= 0.1
    # the program's own queue is found by the usual rule too, on the program's calls only, and
    # its seconds are pool-queue's to save: the comparison names who, and claims none of them
    # (before, both saved the queue)
    (pool,) = [f for f in findings if f.rule == "pool-queue"]
    assert pool.saving is not None and pool.saving.p50 >= 0.1
    assert found.saving is None and not found.claims
    assert "no more is left to save here" in found.fix
    assert over_claimed(findings) == []


async def test_both_slow_gives_the_provider_or_the_path(
    exported: tuple[Telemetry, InMemorySpanExporter],
) -> None:
    telemetry, exporter = exported
    fast = Profile(ttfb=0.02, tokens=2, tokens_per_second=200)
    async with running(fast) as server:
        await _probe(telemetry, server.url("/v1"), 3)
        baseline = as_calls(exporter.get_finished_spans())
        exporter.clear()
        server.state.profile = replace(fast, ttfb=fast.ttfb + SLOW_TTFB)
        await _probe(telemetry, server.url("/v1"), 2)
        await _program(server.url(), calls=3, limit=3)
    calls: list[Any] = [*_earlier([c for c in baseline if is_probe(c)]), *as_calls(
        exporter.get_finished_spans())]  # fmt: skip
    assert TEN_MINUTES_NS / 1e9 > 2 * SAME_TIME
    findings = diagnose(calls)
    (found,) = [f for f in findings if f.rule == "us-or-them"]
    assert found.cause.startswith("the provider or the path is slow, not the program: ")
    probe_now, probe_before, program_p50 = _seconds(found.cause)[:3]
    assert probe_now >= SLOW_TTFB
    assert probe_before < SLOW_TTFB / 2
    assert program_p50 >= SLOW_TTFB
    assert found.saving is None
    # the probe's fresh connections are not taken for the program's
    assert "new-connections" not in [f.rule for f in findings]


async def test_what_no_other_finding_claims_is_the_comparison_s_to_save(
    exported: tuple[Telemetry, InMemorySpanExporter],
) -> None:
    """One call whose loop the program blocked for 0.3 s while it waited for the answer: too
    few requests for event-loop-lag (it needs two), so the stall is no other finding's, and the
    comparison saves it: the program's path beyond the probe's, claimed in the loop's stall."""
    telemetry, exporter = exported
    # the server on a loop of its own: the program's stall does not hold it
    with in_thread(lambda: running(Profile(ttfb=0.1, tokens=2, tokens_per_second=200))) as server:
        await _probe(telemetry, server.url("/v1"), 2)

        async def block() -> None:
            await asyncio.sleep(0.02)  # the request is on its way
            time.sleep(BLOCK)  # noqa: ASYNC251 - the program's own stall under test

        await asyncio.gather(_program(server.url(), calls=1, limit=1), block())
        await _probe(telemetry, server.url("/v1"), 1)
    findings = diagnose(exporter.get_finished_spans())
    assert "event-loop-lag" not in [f.rule for f in findings]
    (found,) = [f for f in findings if f.rule == "us-or-them"]
    assert found.cause.startswith("the program is slow, not 127.0.0.1")
    assert found.saving is not None and found.saving.p50 >= BLOCK / 2
    stall = sum(c.seconds for c in found.claims if c.part in (claims.STALL, claims.CPU))
    assert stall >= BLOCK / 2  # the stall is in the loop's hold, whoever's it was
    assert sum(c.seconds for c in found.claims) == pytest.approx(found.saving.p50)
    assert over_claimed(findings) == []


async def test_no_probe_no_comparison(exported: tuple[Telemetry, InMemorySpanExporter]) -> None:
    _, exporter = exported
    async with running(Profile(ttfb=0.05, tokens=2, tokens_per_second=200)) as server:
        await _program(server.url(), calls=4, limit=1)
    assert "us-or-them" not in [f.rule for f in diagnose(exporter.get_finished_spans())]


async def test_probes_alone_are_not_diagnosed_as_a_program(
    exported: tuple[Telemetry, InMemorySpanExporter],
) -> None:
    telemetry, exporter = exported
    async with running(Profile(ttfb=0.02, tokens=2, tokens_per_second=200)) as server:
        await _probe(telemetry, server.url("/v1"), 3)
    assert diagnose(exporter.get_finished_spans()) == []
