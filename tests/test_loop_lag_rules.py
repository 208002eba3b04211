"""The event-loop monitor's charging rules, on busy stretches and windows the test writes down
(no loop runs, no clock is read for them): what a stall in the middle of a stream is charged."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from llm_latency.event_loop import SETTLE_NS, LoopLagMonitor
from llm_latency.timeline import PHASE_NAMES, RECEIVE, WAIT

MS = 1_000_000
#: An attempt: waits 0-100 ms, receives 100-900 ms.
PHASES = {WAIT: (0, 100 * MS), RECEIVE: (100 * MS, 900 * MS)}


@pytest.fixture
def monitor() -> Iterator[LoopLagMonitor]:
    loop = asyncio.new_event_loop()
    try:
        monitor = LoopLagMonitor(loop)
        monitor._in_flight = 1
        yield monitor
    finally:
        loop.close()


def charged(monitor: LoopLagMonitor, arrivals: list[tuple[int, int]]) -> tuple[int, list[int]]:
    delays = monitor.phase_delays(PHASES.get, len(PHASE_NAMES), lambda: arrivals)
    assert delays is not None
    assert delays.descheduled == 0  # every stretch here is the program's
    return delays.phases[RECEIVE], delays.arrivals


def test_a_gap_that_ends_just_after_a_stall_is_charged_the_stall(monitor: LoopLagMonitor) -> None:
    """The loop was busy 310-600 ms; the chunk after it came at 602 ms, 292 ms after the one
    before: the stall is the receive phase's lag, though the phase ends 300 ms later."""
    monitor.busy.append((310 * MS, 600 * MS, 0.0))
    receive, arrivals = charged(monitor, [(300 * MS, 602 * MS)])
    assert arrivals == [292 * MS]
    assert receive == 292 * MS


def test_a_gap_that_ends_long_after_the_stall_is_the_providers(monitor: LoopLagMonitor) -> None:
    monitor.busy.append((310 * MS, 400 * MS, 0.0))
    receive, arrivals = charged(monitor, [(300 * MS, 400 * MS + SETTLE_NS + MS)])
    assert (receive, arrivals) == (0, [0])


def test_the_phases_end_and_a_gap_share_one_stall_once(monitor: LoopLagMonitor) -> None:
    """The stream's last gap ends with the phase, after one stall: charged once, not twice."""
    monitor.busy.append((700 * MS, 898 * MS, 0.0))
    receive, arrivals = charged(monitor, [(650 * MS, 900 * MS)])
    assert arrivals == [200 * MS]
    assert receive == 200 * MS


def test_two_stalls_in_one_stream_add_up(monitor: LoopLagMonitor) -> None:
    monitor.busy.extend([(200 * MS, 300 * MS, 0.0), (500 * MS, 650 * MS, 0.0)])
    gaps = [(190 * MS, 301 * MS), (490 * MS, 655 * MS)]
    receive, arrivals = charged(monitor, gaps)
    assert arrivals == [101 * MS, 155 * MS]
    assert receive == 256 * MS


def test_the_share_of_a_stretch_without_a_cpu_is_the_machines(monitor: LoopLagMonitor) -> None:
    """The loop ran late 310-600 ms, its thread waiting for a CPU 90 % of that time (another
    process had the core): the gap's delay is the machine's but for a tenth of it."""
    monitor.busy.append((310 * MS, 600 * MS, 0.9))
    delays = monitor.phase_delays(PHASES.get, len(PHASE_NAMES), lambda: [(300 * MS, 600 * MS)])
    assert delays is not None
    assert delays.arrivals == [29 * MS]
    assert delays.phases[RECEIVE] == 29 * MS
    assert delays.descheduled == 261 * MS
