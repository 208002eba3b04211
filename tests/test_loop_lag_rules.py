"""The event-loop monitor's charging rules, on busy stretches and windows the test writes down
(no loop runs, no clock is read for them): what a stall in the middle of a stream is charged,
and what the machine's share of a stretch (the loop's thread waiting for a CPU) is kept as, up
to the phase spans that carry it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import cast

import pytest

from llm_latency import emitter as emitting
from llm_latency import timeline as timeline_module
from llm_latency.attempt_record import AttemptRecord
from llm_latency.facts import read_facts
from llm_latency.in_flight import charge_loop_lag
from llm_latency.lag_monitor import SETTLE_NS, LoopLagMonitor
from llm_latency.timeline import PHASE_NAMES, RECEIVE, SEND, WAIT, Timeline
from tests.conftest import Telemetry
from tests.test_facts import attempt

MS = 1_000_000
#: An attempt: waits 0-100 ms, receives 100-900 ms.
PHASES = {WAIT: (0, 100 * MS), RECEIVE: (100 * MS, 900 * MS)}
#: The same, as ``Timeline.windows`` gives them to the monitor.
WINDOWS = [(phase, start, end) for phase, (start, end) in sorted(PHASES.items())]
DESCHEDULED = "llm_latency.event_loop.descheduled"


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
    delays = monitor.phase_delays(WINDOWS, len(PHASE_NAMES), lambda: arrivals)
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
    delays = monitor.phase_delays(WINDOWS, len(PHASE_NAMES), lambda: [(300 * MS, 600 * MS)])
    assert delays is not None
    assert delays.arrivals == [29 * MS]
    assert delays.phases[RECEIVE] == 29 * MS
    assert delays.descheduled == 261 * MS


def test_the_machines_share_of_a_stall_mid_stream_is_the_receive_phases(
    monitor: LoopLagMonitor,
) -> None:
    """The loop ran late 310-600 ms, its thread waiting for a CPU 90 % of that time, and the
    stream's chunk after it came at 600 ms: the receive phase, which ended long after, keeps
    the machine's share of that gap as its own, as its lag keeps the program's."""
    monitor.busy.append((310 * MS, 600 * MS, 0.9))
    delays = monitor.phase_delays(WINDOWS, len(PHASE_NAMES), lambda: [(300 * MS, 600 * MS)])
    assert delays is not None
    assert delays.phases[RECEIVE] == 29 * MS
    assert len(delays.waited) == len(PHASE_NAMES)
    assert delays.waited[RECEIVE] == 261 * MS
    assert sum(delays.waited) == delays.descheduled == 261 * MS


def test_two_stalls_mid_stream_add_their_machines_shares(monitor: LoopLagMonitor) -> None:
    """Two stalls in one stream, the machine's half of the first and four fifths of the
    second: the receive phase's share is the two gaps' shares added (they do not overlap)."""
    monitor.busy.extend([(200 * MS, 300 * MS, 0.5), (500 * MS, 650 * MS, 0.8)])
    gaps = [(190 * MS, 301 * MS), (490 * MS, 655 * MS)]
    delays = monitor.phase_delays(WINDOWS, len(PHASE_NAMES), lambda: gaps)
    assert delays is not None
    assert delays.arrivals == [50_500_000, 31 * MS]
    assert delays.phases[RECEIVE] == 81_500_000
    assert delays.waited[RECEIVE] == 50_500_000 + 124 * MS == delays.descheduled


def test_the_phases_end_and_a_gap_share_one_stall_without_a_cpu_once(
    monitor: LoopLagMonitor,
) -> None:
    """The stream's last gap ends with the phase, after one stretch the loop's thread spent
    90 % waiting for a CPU: the receive phase's share of it is counted once, not twice, and
    with its lag it stays within the phase; the attempt's whole wait counts it once too (it was
    360 ms: the phase's end's charge and the gap's added up)."""
    monitor.busy.append((700 * MS, 898 * MS, 0.9))
    delays = monitor.phase_delays(WINDOWS, len(PHASE_NAMES), lambda: [(650 * MS, 900 * MS)])
    assert delays is not None
    assert delays.arrivals == [20 * MS]
    assert delays.phases[RECEIVE] == 20 * MS
    assert delays.waited[RECEIVE] == 180 * MS
    assert delays.descheduled == sum(delays.waited) == 180 * MS


def test_the_receive_phases_share_never_outgrows_the_phase(monitor: LoopLagMonitor) -> None:
    """The loop's thread had no CPU from before the headers to the end of a short receive
    phase (100-300 ms), through the wait for the first chunk (100-299 ms): the phase is the
    machine's, once, and no more."""
    monitor.busy.append((90 * MS, 298 * MS, 1.0))
    windows = [(WAIT, 0, 100 * MS), (RECEIVE, 100 * MS, 300 * MS)]
    delays = monitor.phase_delays(windows, len(PHASE_NAMES), lambda: [(100 * MS, 299 * MS)])
    assert delays is not None
    assert delays.phases[RECEIVE] == 0
    assert delays.waited[RECEIVE] == 200 * MS


def test_the_machines_share_is_kept_per_phase(monitor: LoopLagMonitor) -> None:
    """The loop ran late 60-100 ms, its thread waiting for a CPU three quarters of that time,
    and the wait ended at 100 ms: the wait's delay is the program's quarter, and the machine's
    three quarters are kept as the wait's own (the network overhead leaves them out), in the
    attempt's ``descheduled`` too; the receive, which ended long after, has none."""
    monitor.busy.append((60 * MS, 100 * MS, 0.75))
    delays = monitor.phase_delays(WINDOWS, len(PHASE_NAMES))
    assert delays is not None
    assert delays.phases[WAIT] == 10 * MS
    assert len(delays.waited) == len(PHASE_NAMES)
    assert delays.waited[WAIT] == 30 * MS
    assert sum(delays.waited) == delays.descheduled == 30 * MS


def test_the_machines_share_of_the_wait_is_not_network_overhead(monitor: LoopLagMonitor) -> None:
    """From the monitor's stretches to the request span's facts, as the emitter hands them
    over: sent at 0-20 ms, first byte at 320 ms, the server's 250 ms; the loop ran late the
    last 60 ms of the wait, its thread waiting for a CPU for 50 of them. The 70 ms the server
    does not account for are 10 ms of the program's lag, 50 ms of the machine's and 10 ms of
    the network's."""
    timeline = attempt(processing_ms="250")
    t0 = timeline.start_ns
    monitor.busy.append((t0 + 260 * MS, t0 + 320 * MS, 5 / 6))
    record = cast(AttemptRecord, SimpleNamespace(loop_monitor=monitor, timeline=timeline))
    lag = charge_loop_lag(record, timeline.windows())
    facts = read_facts(timeline, lag, frozenset({"openai-processing-ms"}))
    assert facts.server_processing == 0.25
    assert facts.event_loop_lag is not None and abs(facts.event_loop_lag - 0.01) < 1e-6
    assert abs(facts.descheduled - 0.05) < 1e-6
    assert facts.network_overhead is not None and abs(facts.network_overhead - 0.01) < 1e-6


def test_each_phase_span_carries_its_share_of_the_machines_wait(
    monitor: LoopLagMonitor, telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the monitor's stretches to the exported spans: sent at 0-20 ms, first byte at
    320 ms (the server's 250 ms), chunks at 320, 360 and 700 ms, the end at 800 ms. The loop
    ran late 200-320 ms, its thread waiting for a CPU 11/12 of it (110 ms; the program's
    10 ms), and 400-698 ms, half of it (150 ms). The wait's span carries the 60 ms of the
    machine's that what the server's time leaves of the window allows beside the lag; the
    receive's the 150 ms of its stream's gap; the send, which the loop did not delay, none.
    The request span keeps the attempt's whole wait."""
    clock = [0]
    monkeypatch.setattr(timeline_module, "clock_ns", lambda: clock[0])
    clock[0] = t0 = 10**12
    timeline = Timeline("POST", "http://api.llm.test/v1/chat/completions")
    emitter = emitting.active
    assert emitter is not None
    emitter.start(timeline, "api.llm.test", None, "/v1/chat/completions")
    (record,) = emitter.in_flight()
    record.loop_monitor = monitor
    monitor.busy.extend(
        [(t0 + 200 * MS, t0 + 320 * MS, 11 / 12), (t0 + 400 * MS, t0 + 698 * MS, 0.5)]
    )
    timeline.begin(SEND, at=t0)
    timeline.end_phase(SEND, at=t0 + 20 * MS)
    timeline.begin(WAIT, at=t0 + 20 * MS)
    timeline.end_phase(WAIT, at=t0 + 320 * MS)
    timeline.begin(RECEIVE, at=t0 + 320 * MS)
    timeline.status_code = 200
    timeline.response_headers = [(b"openai-processing-ms", b"250")]
    for at in (320, 360, 700):
        clock[0] = t0 + at * MS
        timeline.chunk(b"{}")
    emitter.finish(timeline, at=t0 + 800 * MS)
    (attempt,) = telemetry.attempts()
    shares = {
        name: (span.attributes or {}).get(DESCHEDULED)
        for name, span in telemetry.phases(attempt).items()
    }
    assert shares == {"send": None, "wait": 0.06, "receive": 0.15}
    attributes = attempt.attributes or {}
    assert attributes[DESCHEDULED] == 0.26
    assert attributes["llm_latency.network_overhead"] == 0.0


def test_one_exemplar_per_late_stretch(monitor: LoopLagMonitor) -> None:
    """The first attempt charged in a late stretch is the one whose lag record carries its
    trace exemplar; the next ones charged in the same stretch are not; the first in the next
    stretch is. An attempt the loop did not delay is not marked."""
    monitor._in_flight = 5
    monitor.busy.append((850 * MS, 899 * MS, 0.0))
    marks = []
    for _ in range(2):
        delays = monitor.phase_delays(WINDOWS, len(PHASE_NAMES))
        assert delays is not None and delays.phases[RECEIVE] == 50 * MS
        marks.append(delays.exemplar)
    monitor.busy.append((960 * MS, 998 * MS, 0.0))
    later = [(WAIT, 0, 100 * MS), (RECEIVE, 100 * MS, 1000 * MS)]
    delays = monitor.phase_delays(later, len(PHASE_NAMES))
    assert delays is not None and delays.phases[RECEIVE] == 40 * MS
    marks.append(delays.exemplar)
    monitor.busy.append((1500 * MS, 1510 * MS, 0.0))
    undelayed = monitor.phase_delays([(WAIT, 0, 100 * MS)], len(PHASE_NAMES))
    assert undelayed is not None and sum(undelayed.phases) == 0
    marks.append(undelayed.exemplar)
    assert marks == [True, False, True, False]
