"""Assertions shared by the client tests: phase durations against injected delays, phases
tiling their request span, failure outcomes compared with and without the plugin."""

from __future__ import annotations

import contextlib
import os
import re
import socket
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics.export import (
    ExponentialHistogramDataPoint,
    HistogramDataPoint,
    NumberDataPoint,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

import llm_latency
from llm_latency.diagnosis.rate_limits import RETRY_WAIT_MIN_EXCESS, RETRY_WAIT_MIN_EXCESS_SHARE
from tests.attributes import attributes
from tests.conftest import Telemetry, seconds
from tests.cpu_waits import collector_pauses, machine_waits

# A phase lasts at least its injected delay, and not much more on a loaded 2-core machine.
SLACK = 0.3
EARLY = 0.005  # timers may fire this much early


#: A point of any metric kind, as ``Metric.data.data_points`` holds them.
DataPoint = NumberDataPoint | HistogramDataPoint | ExponentialHistogramDataPoint


def int_value(point: DataPoint) -> int:
    """The value of a counter's or gauge's point that counts things (connections, requests)."""
    assert isinstance(point, NumberDataPoint), point
    assert isinstance(point.value, int), point.value
    return point.value


def histogram(point: DataPoint) -> HistogramDataPoint:
    """A histogram's point (its ``count`` and ``sum``)."""
    assert isinstance(point, HistogramDataPoint), point
    return point


def assert_about(value: float, expected: float) -> None:
    assert expected - EARLY <= value <= expected + SLACK, (value, expected)


#: How late a hook may observe a phase boundary on a loaded machine (its callback waits for the
#: loop or the thread to run): a phase whose start is seen late looks that much shorter.
OBSERVED_LATE = 0.05


def server_phase_misses(
    phases: dict[str, ReadableSpan], wait: float, receive: float
) -> list[tuple[float, str]]:
    """The server waited ``wait`` before its first byte and took ``receive`` to send the rest.
    From the start of the send, neither can end sooner (the server's clock started when the
    request reached it); each phase alone is about its delay, give or take a boundary observed
    late, and never much longer. What the phases got wrong: by how much (s), in words."""
    send_start = phases["send"].start_time
    wait_end, receive_end = phases["wait"].end_time, phases["receive"].end_time
    assert send_start is not None and wait_end is not None and receive_end is not None
    found: list[tuple[float, str]] = []

    def within(name: str, value: float, low: float, high: float) -> None:
        if not low <= value <= high:
            found.append(
                (max(low - value, value - high), f"{name} {value:.3f} s, not in {low}..{high}")
            )

    within("send to first byte", (wait_end - send_start) / 1e9, wait - EARLY, wait + SLACK)
    total = wait + receive
    within("send to last byte", (receive_end - send_start) / 1e9, total - EARLY, total + SLACK)
    for name, expected in (("wait", wait), ("receive", receive)):
        span = phases[name]
        assert span.start_time is not None and span.end_time is not None
        duration = (span.end_time - span.start_time) / 1e9
        within(name, duration, expected - OBSERVED_LATE, expected + SLACK)
    return found


#: Runs at most of a timed request, when the machine measurably disturbed the run.
TRIES = 3


async def served_within(
    telemetry: Telemetry,
    send: Callable[[], Awaitable[object]],
    wait: float,
    receive: float,
    attempt: Callable[[Telemetry], ReadableSpan] = Telemetry.request,
    total: float | None = None,
) -> ReadableSpan:
    """Run ``send`` and check the phases of its ``attempt`` (the only request span, by
    default) against the server's ``wait`` and ``receive`` (:func:`server_phase_misses`), and
    with ``total`` the attempt's whole duration against it (what the test injected in all: a
    slow name server's delay too); returns that span. A run that misses them by no more than what the machine measurably
    took meanwhile runs again, up to :data:`TRIES` times: the run-queue waits of this
    process's threads (the program's, and the test server's loop) and the garbage collector's
    pauses, time in which a boundary is seen late whoever is right (a sync client's thread
    kept from a CPU starts reading the body that late: its receive phase starts then). Any
    other miss fails at once."""
    for _ in range(TRIES):
        telemetry.exporter.clear()  # a run again: only its own spans
        with machine_waits(os.getpid()) as waited, collector_pauses() as collected:
            await send()
        span = attempt(telemetry)
        found = server_phase_misses(telemetry.phases(span), wait, receive)
        if total is not None:
            duration = seconds(span)
            if not total - EARLY <= duration <= total + SLACK:
                by = max(total - EARLY - duration, duration - total - SLACK)
                found.append((by, f"the attempt {duration:.3f} s, not in about {total} s"))
        took = waited.peers + collected.seconds  # this thread is one of the process's
        if not found or max(by for by, _ in found) > took:
            break
    assert not found, f"{found}; {waited}, the garbage collector ran {collected.seconds:.3f} s"
    return span


#: How the ``rate-limits`` finding of one call refused once and retried begins, by its form.
REFUSED_ONCE = "→ 1 of 2 attempts were rate limited (429) and 1 was a retry"
WAITED_TOO_LONG = "→ 1 of 2 attempts were rate limited (429) and 1 were retries"


def refused_once(asked: float, waited: float) -> set[str]:
    """How the ``rate-limits`` finding may begin for one call refused once (429, retry-after
    ``asked`` s) and retried after a wait measured at ``waited`` s. A wait longer than asked by
    the rule's margin (10 ms, and a fifth of what was asked) is the finding, the wait's
    (:data:`WAITED_TOO_LONG`: on a loaded machine a process kept from a CPU, or held by its
    garbage collector, starts its retry that late); a wait as asked leaves the refusal
    (:data:`REFUSED_ONCE`). Either, within a ms of the margin: printed durations are rounded."""
    margin = max(RETRY_WAIT_MIN_EXCESS, RETRY_WAIT_MIN_EXCESS_SHARE * asked)
    beyond = waited - asked
    if abs(beyond - margin) <= 0.001:
        return {REFUSED_ONCE, WAITED_TOO_LONG}
    return {WAITED_TOO_LONG} if beyond > margin else {REFUSED_ONCE}


def assert_tiles(telemetry: Telemetry) -> None:
    """Phases are in order, do not overlap, and lie within their request span (this runs after
    every test too; calling it in a test checks at that point)."""
    telemetry.assert_tiles()


@dataclass
class Outcome:
    kind: type[BaseException] | None
    text: str


async def run(scenario: Callable[[], Awaitable[Any]]) -> Outcome:
    try:
        await scenario()
    except BaseException as exc:  # CancelledError included: that is the program's outcome
        # Object addresses in messages (urllib3 names its connection objects) differ per run.
        return Outcome(type(exc), re.sub(r"0x[0-9a-f]+", "0x?", str(exc)))
    return Outcome(None, "")


async def compare(telemetry: Telemetry, scenario: Callable[[], Awaitable[Any]]) -> Outcome:
    """Run ``scenario`` without and then with the plugin; both must end the same way."""
    llm_latency.uninstrument()
    bare = await run(scenario)
    assert telemetry.spans() == []
    telemetry.instrument()
    traced = await run(scenario)
    assert traced == bare
    telemetry.assert_all_ended_once()
    return traced


def assert_failed(
    telemetry: Telemetry, phase: str, error_type: str, request: ReadableSpan | None = None
) -> None:
    """The request (the only one, unless given) failed in ``phase`` with ``error_type``, as
    DESIGN.md says: the failed phase span ERROR with the exception, and no later phase."""
    request = request or telemetry.request()
    assert request.status.status_code is StatusCode.ERROR
    assert attributes(request)["llm_latency.failed_phase"] == phase
    assert attributes(request)["error.type"] == error_type
    failed = telemetry.phases(request)[phase]
    assert failed.status.status_code is StatusCode.ERROR
    assert attributes(failed)["error.type"] == error_type
    (event,) = failed.events
    assert event.name == "exception"
    assert event.attributes is not None
    assert str(event.attributes["exception.type"]).endswith(error_type)
    assert failed.end_time is not None
    later = [p for p in telemetry.phases(request).values() if (p.start_time or 0) > failed.end_time]
    assert later == []


@contextlib.contextmanager
def full_backlog() -> Iterator[int]:
    """A port whose listen backlog is full: a TCP connect to it hangs (SYNs are dropped)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    try:
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()
