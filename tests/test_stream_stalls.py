"""A stall of the program's own loop in the middle of a stream is the program's lag, not the
provider's gap.

The server (tests/bad_servers.py ``PacedStream``, in threads of its own: blocking the test's
loop does not delay it) sends each stream's events at its own pace. The program blocks its
loop (``time.sleep`` in a coroutine) while the streams are in flight: the events that arrive
meanwhile wait in the socket buffers, and the gap between two chunks that the attempt sees
grows by the stall. That gap is the program's: charged to the receive phase as
``llm_latency.event_loop.lag``, and not in ``llm_latency.stream.max_gap``, the provider's and
the network's longest pause.

Every bound is a share of the injected stall and of the server's pace. A run that misses a
bound by no more than what the machine measurably took meanwhile (the loop's thread kept from
a CPU, ``llm_latency.event_loop.descheduled``; the server's threads late on their pace; the test
process's garbage collector) runs again, up to three times; any other miss fails at once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from opentelemetry.sdk.trace import ReadableSpan

import llm_latency
from tests.bad_servers import PacedStream
from tests.conftest import Telemetry
from tests.cpu_waits import collector_pauses

pytestmark = pytest.mark.xdist_group("timing")

STREAMS = 10
LAG = "llm_latency.event_loop.lag"
MAX_GAP = "llm_latency.stream.max_gap"
DESCHEDULED = "llm_latency.event_loop.descheduled"
#: Runs of a stalled scenario at most, when what the machine took covers a miss.
TRIES = 3


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


@dataclass
class Stalled:
    """One run's attempts, and what the machine measurably took while it ran (s): the longest
    time an attempt's loop thread waited for a CPU (the product's ``descheduled``), the longest
    a server thread sent an event late on its pace, and the test process's garbage collector's
    pauses (each holds back the chunks the attempt sees, and none is the program's stall)."""

    attempts: list[ReadableSpan]
    took: float


def stalled(telemetry: Telemetry, server: PacedStream, after_events: int, stall: float) -> Stalled:
    """:func:`streams_stalled` against ``server`` (started here, closed after): its attempts."""
    telemetry.exporter.clear()  # a run again: only its own attempts
    with collector_pauses() as collected, server:
        asyncio.run(streams_stalled(server.url(), STREAMS, after_events, stall))
    attempts = telemetry.attempts()
    assert len(attempts) == STREAMS
    descheduled = max(float(attributes_of(a).get(DESCHEDULED, 0.0)) for a in attempts)
    return Stalled(attempts, descheduled + server.late + collected.seconds)


def attributes_of(attempt: ReadableSpan) -> dict[str, Any]:
    return dict(attempt.attributes or {})


def receive_lag(telemetry: Telemetry, attempt: ReadableSpan) -> float:
    receive = telemetry.phases(attempt)["receive"]
    value = (receive.attributes or {}).get(LAG, 0.0)
    assert isinstance(value, float)
    return value


def test_a_stall_in_the_middle_of_streams_is_the_programs_lag(telemetry: Telemetry) -> None:
    """Ten streams, 40 events 20 ms apart; the loop blocked 0.3 s once each has read five:
    every attempt's receive phase carries the stall as lag, and its longest gap is the
    server's pace, not the stall."""
    stall = 0.3

    def misses(run: Stalled) -> list[tuple[float, str]]:
        """What the run got wrong: by how much (s), in words."""
        found: list[tuple[float, str]] = []
        for attempt in run.attempts:
            attributes = attributes_of(attempt)
            gap = attributes[MAX_GAP]
            lag = attributes[LAG]
            assert isinstance(gap, float) and isinstance(lag, float)
            assert lag >= receive_lag(telemetry, attempt) - 1e-9
            # The stall, less its first tick interval (10 ms) the monitor cannot see, and what
            # a loaded machine may take from its end: at least half of it.
            if receive_lag(telemetry, attempt) < stall / 2:
                found.append((stall / 2 - receive_lag(telemetry, attempt), f"lag: {attributes}"))
            # The server's gap is 20 ms: what is left of the stall in it is what the monitor
            # could not tell from the server's pace.
            if gap >= stall / 2:
                found.append((gap - stall / 2, f"gap: {attributes}"))
        return found

    for _ in range(TRIES):
        run = stalled(telemetry, PacedStream(events=40, interval=0.02, headers_after=0.1), 5, stall)
        found = misses(run)
        if not found or max(by for by, _ in found) > run.took:
            break
    assert not found, f"{found}; the machine took {run.took:.3f} s meanwhile"


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
