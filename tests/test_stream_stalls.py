"""A stall of the program's own loop in the middle of a stream is the program's lag, not the
provider's gap.

The server (tests/bad_servers.py ``PacedStream``, in threads of its own: blocking the test's
loop does not delay it) sends each stream's events at its own pace. The program blocks its
loop (``time.sleep`` in a coroutine) while the streams are in flight: the events that arrive
meanwhile wait in the socket buffers, and the gap between two chunks that the attempt sees
grows by the stall. That gap is the program's: charged to the receive phase as
``llm_latency.event_loop.lag``, and not in ``llm_latency.stream.max_gap``, the provider's and
the network's longest pause.

Every bound is a share of the injected stall and of the server's pace.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from opentelemetry.sdk.trace import ReadableSpan

import llm_latency
from tests.bad_servers import PacedStream
from tests.conftest import Telemetry

pytestmark = pytest.mark.xdist_group("timing")

STREAMS = 10
LAG = "llm_latency.event_loop.lag"
MAX_GAP = "llm_latency.stream.max_gap"


class Progress:
    """Set once each of ``expected`` streams has read ``events`` events."""

    def __init__(self, expected: int, events: int) -> None:
        self.expected = expected
        self.events = events
        self.reached = 0
        self.event = asyncio.Event()

    def read(self, count: int) -> None:
        if count == self.events:
            self.reached += 1
            if self.reached == self.expected:
                self.event.set()


async def streams_stalled(url: str, streams: int, after_events: int, stall: float) -> None:
    """``streams`` concurrent aiohttp streams from ``url``; the loop is blocked for ``stall`` s
    once each has read ``after_events`` events (0: once each has its headers)."""
    progress = Progress(streams, after_events)

    async def stall_the_loop() -> None:
        await progress.event.wait()
        time.sleep(stall)  # noqa: ASYNC251 - the program's own stall under test

    async with aiohttp.ClientSession() as session:

        async def one() -> None:
            async with session.post(url, json={"stream": True}) as response:
                progress.read(0)
                events = 0
                async for line in response.content:
                    if line.startswith(b"data: {"):
                        events += 1
                        progress.read(events)

        await asyncio.gather(stall_the_loop(), *(one() for _ in range(streams)))


@pytest.fixture
def paced() -> Iterator[PacedStream]:
    with PacedStream(events=40, interval=0.02, headers_after=0.1) as server:
        yield server


def attributes_of(attempt: ReadableSpan) -> dict[str, Any]:
    return dict(attempt.attributes or {})


def receive_lag(telemetry: Telemetry, attempt: ReadableSpan) -> float:
    receive = telemetry.phases(attempt)["receive"]
    value = (receive.attributes or {}).get(LAG, 0.0)
    assert isinstance(value, float)
    return value


def test_a_stall_in_the_middle_of_streams_is_the_programs_lag(
    telemetry: Telemetry, paced: PacedStream
) -> None:
    """Ten streams, 40 events 20 ms apart; the loop blocked 0.3 s once each has read five:
    every attempt's receive phase carries the stall as lag, and its longest gap is the
    server's pace, not the stall."""
    stall = 0.3
    asyncio.run(streams_stalled(paced.url(), STREAMS, 5, stall))
    attempts = telemetry.attempts()
    assert len(attempts) == STREAMS
    for attempt in attempts:
        attributes = attributes_of(attempt)
        gap = attributes[MAX_GAP]
        lag = attributes[LAG]
        assert isinstance(gap, float) and isinstance(lag, float)
        # The stall, less its first tick interval (10 ms) the monitor cannot see, and what a
        # loaded machine may take from its end: at least half of it.
        assert receive_lag(telemetry, attempt) >= stall / 2, attributes
        assert lag >= receive_lag(telemetry, attempt) - 1e-9
        # The server's gap is 20 ms: what is left of the stall in it is what the monitor
        # could not tell from the server's pace.
        assert gap < stall / 2, attributes


def test_a_stall_before_the_first_event_is_the_programs_lag(telemetry: Telemetry) -> None:
    """The headers come after 0.1 s, the first event 0.1 s later; the loop is blocked 0.3 s
    from the moment each stream has its headers: the first event waits in the buffer, and the
    wait for it is the program's lag, not the provider's."""
    stall = 0.3
    server = PacedStream(events=30, interval=0.02, headers_after=0.1, first_event_after=0.1)
    with server:
        asyncio.run(streams_stalled(server.url(), STREAMS, 0, stall))
    attempts = telemetry.attempts()
    assert len(attempts) == STREAMS
    for attempt in attempts:
        # The first event was due 0.1 s into the stall: the stall's rest (0.2 s) delayed it.
        assert receive_lag(telemetry, attempt) >= (stall - 0.1) / 2, attributes_of(attempt)


def test_no_stream_stall_finding_for_the_programs_own_stall(telemetry: Telemetry) -> None:
    """Ten streams of 60 events 20 ms apart, the loop blocked 1.2 s after their fifth (a gap that
    stream-stall would report: over 1 s and 5 times the stream's pace): diagnose() names the
    program's event loop, and blames no stall on the provider."""
    stall = 1.2
    with PacedStream(events=60, interval=0.02, headers_after=0.05) as server:
        asyncio.run(streams_stalled(server.url(), STREAMS, 5, stall))
    attempts = telemetry.attempts()
    assert len(attempts) == STREAMS
    for attempt in attempts:
        assert receive_lag(telemetry, attempt) >= stall / 2
    ids = [finding.rule for finding in llm_latency.diagnose(telemetry.spans())]
    assert "stream-stall" not in ids
    assert "event-loop-lag" in ids
