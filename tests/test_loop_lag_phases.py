"""Event-loop lag in every phase of an asyncio attempt, not only in the wait and the receive.

The issue's reproduction, made deterministic: ten requests on fresh TLS connections, and the
program blocks its own loop (``time.sleep`` in a coroutine) once all ten have begun opening
their connection. The server is ``llm-latency mock-server --tls --tls-delay D`` in its own
process (blocking this loop does not delay it): it holds each ClientHello for D seconds, so
every attempt is still setting up its connection when the stall begins, whatever the load.

- When what the set-up waited for (the TCP connect, the server's TLS answer after D) arrives
  during the stall, the set-up phases end only once the loop runs again: the stall is the
  program's, charged to those phases (``llm_latency.event_loop.lag`` on the phase spans) and to
  the attempt (the request span's attribute is the sum over its phases).
- When the stall ends before the server's answer, it delayed nothing in the handshake: the
  TLS phase's time stays the network's.

Every bound is a share of the injected stall and delay. aiohttp runs on asyncio's loop and on
uvloop. A loaded machine takes its own share, and the product keeps it apart: the part of a late
stretch the loop's thread spent waiting for a CPU is not the program's lag but the attempt's
``llm_latency.event_loop.descheduled`` (never more than the thread's run-queue wait the test
reads itself, ``tests/cpu_waits.py``): the bounds count it with the lag. A run that misses a
bound by no more than what the machine measurably took meanwhile (the loop's thread and the
server kept from a CPU, the test process's garbage collector) runs again, up to three times;
any other miss fails at once.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import httpx2
import pytest
import uvloop
from opentelemetry.sdk.trace import ReadableSpan

from tests.command_line import mock_server
from tests.conftest import Telemetry, seconds
from tests.cpu_waits import Collected, Waited, collector_pauses, machine_waits

pytestmark = pytest.mark.xdist_group("timing")

REQUESTS = 10
LAG = "llm_latency.event_loop.lag"
DESCHEDULED = "llm_latency.event_loop.descheduled"
SET_UP = ("queue", "dns", "connect", "tls")
KINDS = ["aiohttp", "aiohttp-uvloop", "httpx-async", "httpx2-async"]
#: Runs of a stalled scenario at most, when what the machine took covers a miss.
TRIES = 3


class Probe:
    """The longest the loop was late besides the injected stall, seen by a task of the test's
    own that sleeps 5 ms at a time: on a loaded machine the whole process can be descheduled,
    and the lag is then real, whatever the program did."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.stall = (0.0, 0.0)

    async def watch(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.005)
            after = time.perf_counter()
            if not before <= self.stall[0] <= after:
                self.longest = max(self.longest, after - before - 0.005)


class AllConnecting:
    """Set once ``expected`` requests have begun opening their connection (a client's hook
    counts them: aiohttp's ``on_connection_create_start``, httpcore's ``connect_tcp.started``)."""

    def __init__(self, expected: int = REQUESTS) -> None:
        self.expected = expected
        self.count = 0
        self.event = asyncio.Event()

    async def one_more(self, *_: Any) -> None:
        self.count += 1
        if self.count == self.expected:
            self.event.set()

    async def trace(self, name: str, info: dict[str, Any]) -> None:
        """httpcore's ``trace`` extension: each connection's TCP connect starting."""
        if name == "connection.connect_tcp.started":
            await self.one_more()


async def requests_while_stalled(kind: str, url: str, ca_file: str, stall: float) -> float:
    """REQUESTS concurrent requests on fresh connections with ``kind``; the loop is blocked for
    ``stall`` s once all of them are opening their connection. Returns the longest stall of
    the loop that a task of the test's own saw besides (a loaded machine's)."""
    context = ssl.create_default_context(cafile=ca_file)
    connecting = AllConnecting()
    probe = Probe()

    async def stall_the_loop() -> None:
        await connecting.event.wait()
        start = time.perf_counter()
        time.sleep(stall)  # noqa: ASYNC251 - the program's own stall under test
        probe.stall = (start, time.perf_counter())

    one: Callable[[], Awaitable[Any]]
    close: Callable[[], Awaitable[None]]
    if kind.startswith("aiohttp"):
        trace = aiohttp.TraceConfig()
        trace.on_connection_create_start.append(connecting.one_more)
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ssl=context), trace_configs=[trace]
        )

        async def one() -> None:
            async with session.post(url, json={}) as response:
                await response.read()

        close = session.close
    else:
        module: Any = httpx2 if kind.startswith("httpx2") else httpx
        client = module.AsyncClient(verify=context)

        async def one() -> None:
            response = await client.post(url, json={}, extensions={"trace": connecting.trace})
            response.raise_for_status()

        close = client.aclose
    watcher = asyncio.create_task(probe.watch())
    try:
        await asyncio.gather(stall_the_loop(), *(one() for _ in range(REQUESTS)))
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await close()
    return probe.longest


def run(kind: str, main: Coroutine[Any, Any, float]) -> float:
    """Run ``main`` on uvloop for the ``-uvloop`` kinds, else on asyncio's own loop."""
    if kind.endswith("uvloop"):
        return uvloop.run(main)
    return asyncio.run(main)


def lag_of(span: ReadableSpan) -> float:
    """A phase span's lag; absent means none (the attribute is written only above 0)."""
    attributes = span.attributes or {}
    if LAG not in attributes:
        return 0.0
    value = attributes[LAG]
    assert isinstance(value, float) and value > 0, value
    return value


def check_attempt(
    telemetry: Telemetry, attempt: ReadableSpan, fresh: bool = True
) -> dict[str, tuple[float, float]]:
    """Per phase of ``attempt`` (on a ``fresh`` connection, or a pooled one): (duration, lag).
    Checks the contract: each phase's lag lies within the phase, and the attempt's is the sum
    over its phases."""
    phases = telemetry.phases(attempt)
    expected = {"connect", "tls", "send", "wait", "receive"} if fresh else {"send", "wait"}
    assert expected <= set(phases), set(phases)
    found = {name: (seconds(span), lag_of(span)) for name, span in phases.items()}
    for name, (duration, lag) in found.items():
        assert 0 <= lag <= duration + 1e-9, (name, found)
    total = attempt.attributes[LAG] if attempt.attributes else None
    assert isinstance(total, float)
    assert total == pytest.approx(sum(lag for _, lag in found.values()), abs=1e-9)
    return found


def descheduled_of(attempt: ReadableSpan) -> float:
    """How long the attempt's loop thread waited for a CPU in the late stretches that delayed
    its phases: the machine's share, which is in no phase's lag (absent: none)."""
    value = (attempt.attributes or {}).get(DESCHEDULED, 0.0)
    assert isinstance(value, float), value
    return value


@dataclass
class Stalled:
    """The attempts of one run of :func:`stalled_while_connecting`, the longest stall a loaded
    machine added besides (as the test's own task saw it), and what the machine took from the
    loop's thread and from the server's process while it ran, and the garbage collector's
    pauses."""

    attempts: list[ReadableSpan]
    longest: float
    waited: Waited
    collected: Collected

    @property
    def took(self) -> float:
        """What the machine measurably took from the run (s)."""
        return self.waited.total + self.collected.seconds


def stalled_while_connecting(
    telemetry: Telemetry, kind: str, delay: float, stall: float
) -> Stalled:
    """REQUESTS requests with ``kind`` to ``mock-server --tls --tls-delay delay``, the loop
    stalled ``stall`` s as they connect: their request spans (all of them), the longest stall a
    loaded machine added besides, and the run-queue waits of this thread and of the server."""
    telemetry.exporter.clear()  # a run again: only its own attempts
    with mock_server("--tls", "--tls-delay", str(delay), "--ttfb", "0.01", "--tokens", "1") as mock:
        assert mock.ca_file is not None
        with machine_waits(mock.process.pid) as waited, collector_pauses() as collected:
            longest = run(kind, requests_while_stalled(kind, mock.url, mock.ca_file, stall))
    attempts = telemetry.attempts()
    assert len(attempts) == REQUESTS
    for attempt in attempts:  # the machine's share is the kernel's count, never more
        assert descheduled_of(attempt) <= waited.thread + 0.001, (descheduled_of(attempt), waited)
    return Stalled(attempts, longest, waited, collected)


def checked_while_stalled(
    telemetry: Telemetry,
    kind: str,
    delay: float,
    stall: float,
    misses: Callable[[Stalled], list[tuple[float, str]]],
) -> None:
    """Runs :func:`stalled_while_connecting` and checks the run with ``misses`` (what it got
    wrong: by how much, in s, and in words). A run that misses by no more than what the machine
    measurably took meanwhile (the loop's thread or the server kept from a CPU: the monitor ties
    a phase's end to the stall only when the end comes within 20 ms of it, and a starved server
    answers the handshake late; the garbage collector's pauses) says nothing of the monitor: it
    runs again, up to TRIES times. Any other miss fails at once; the message says what the
    machine took."""
    for _ in range(TRIES):
        stalled = stalled_while_connecting(telemetry, kind, delay, stall)
        found = misses(stalled)
        if not found or max(by for by, _ in found) > stalled.took:
            break
    assert not found, (
        f"{found}; {stalled.waited}, the garbage collector ran {stalled.collected.seconds:.3f} s "
        f"(longest other stall {stalled.longest:.3f} s)"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_a_stall_while_connecting_is_the_programs_lag(telemetry: Telemetry, kind: str) -> None:
    """The server's TLS answer (after 0.1 s) and the TCP connects arrive during a 0.3 s stall:
    the set-up phases end after it, and the stall is charged to them."""
    delay, stall = 0.1, 0.3

    def misses(stalled: Stalled) -> list[tuple[float, str]]:
        found: list[tuple[float, str]] = []
        for attempt in stalled.attempts:
            phases = check_attempt(telemetry, attempt)
            set_up = sum(phases[name][0] for name in SET_UP if name in phases)
            set_up_lag = sum(phases[name][1] for name in SET_UP if name in phases)
            machine = descheduled_of(attempt)
            # The stall, less its first tick interval (10 ms) that the monitor cannot see; what
            # ends the set-up may come later than the monitor ties to the stall: half of it. A
            # late stretch is split by the share of it the thread waited for a CPU: that share
            # of the stall is the machine's, not the program's.
            if set_up_lag + machine < stall / 2:
                found.append((stall / 2 - set_up_lag - machine,
                              f"set-up lag {set_up_lag:.3f} s (machine {machine:.3f} s) < "
                              f"{stall / 2} s: {phases}"))  # fmt: skip
            # What is left is the handshake's delay and the loop's own work on ten handshakes,
            # plus whatever a loaded machine stalled the whole process: the stall was taken out,
            # and so was the machine's share of the loop's delay, which the attempt counts apart.
            left = set_up - set_up_lag - machine
            bound = delay + stall / 2 + stalled.longest
            if left >= bound:
                found.append((left - bound, f"set-up less lag {left:.3f} s: {phases}"))
            # The stall was in the set-up: the wait (a 10 ms server) carries none of it, only
            # what a loaded machine took besides.
            if phases["wait"][1] >= stall / 3 + stalled.longest:
                found.append((phases["wait"][1] - stall / 3 - stalled.longest,
                              f"wait lag {phases['wait'][1]:.3f} s: {phases}"))  # fmt: skip
        return found

    checked_while_stalled(telemetry, kind, delay, stall, misses)


@pytest.mark.parametrize("kind", KINDS)
def test_a_stall_that_ends_before_the_answer_delays_nothing(
    telemetry: Telemetry, kind: str
) -> None:
    """The server's TLS answer comes 0.6 s after the ClientHello, long after a 0.15 s stall
    that began while the connections opened: the handshake's time is the network's."""
    delay, stall = 0.6, 0.15

    def misses(stalled: Stalled) -> list[tuple[float, str]]:
        found: list[tuple[float, str]] = []
        for attempt in stalled.attempts:
            phases = check_attempt(telemetry, attempt)
            tls, tls_lag = phases["tls"]
            if tls < delay:
                found.append((delay - tls, f"tls {tls:.3f} s < {delay} s: {phases}"))
            # The handshake's wait for the server stays the network's: at most the loop's own
            # work on ten handshakes that ended together, and what a loaded machine took besides.
            least = delay * 0.75 - stalled.longest
            if tls - tls_lag < least:
                found.append(
                    (least - tls + tls_lag, f"tls less lag {tls - tls_lag:.3f} s: {phases}")
                )
        return found

    checked_while_stalled(telemetry, kind, delay, stall, misses)


async def one_request_stalled_while_waiting(url: str, stall: float) -> None:
    """One aiohttp request; the loop is blocked for ``stall`` s as soon as its body is out."""
    sent = asyncio.Event()

    async def body_sent(*_: Any) -> None:
        sent.set()

    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(body_sent)

    async def stall_the_loop() -> None:
        await sent.wait()
        time.sleep(stall)  # noqa: ASYNC251 - the program's own stall under test

    async with aiohttp.ClientSession(trace_configs=[trace]) as session:

        async def one() -> None:
            async with session.post(url, json={}) as response:
                await response.read()

        await asyncio.gather(stall_the_loop(), one())


@pytest.mark.parametrize("kind", ["aiohttp", "aiohttp-uvloop"])
def test_a_stall_while_waiting_is_the_programs_lag(telemetry: Telemetry, kind: str) -> None:
    """The answer, 0.2 s after the request, waits in the socket buffer while the loop is blocked
    for 0.45 s from the send: the lag is the part of the stall the server's time leaves."""
    ttfb, stall = 0.2, 0.45
    with mock_server("--ttfb", str(ttfb), "--tokens", "1") as mock:
        run_plain = one_request_stalled_while_waiting(mock.url, stall)
        if kind.endswith("uvloop"):
            uvloop.run(run_plain)
        else:
            asyncio.run(run_plain)
    (attempt,) = telemetry.attempts()
    phases = {name: (seconds(s), lag_of(s)) for name, s in telemetry.phases(attempt).items()}
    assert {"connect", "send", "wait", "receive"} <= set(phases), phases
    # The send's end is seen by a callback after the body is written: the stall may end the
    # send or the wait; either way it is in the send-to-first-byte window.
    window = phases["send"][0] + phases["wait"][0]
    window_lag = phases["send"][1] + phases["wait"][1]
    attributes = attempt.attributes or {}
    processing = attributes["llm_latency.server.processing_time"]
    assert isinstance(processing, float) and processing >= ttfb - 0.001
    # The stall, less the server's own time, is the program's: capped by what the server says.
    assert window_lag >= (stall - processing) * 0.8, phases
    assert window >= stall, phases
    overhead = attributes["llm_latency.network_overhead"]
    assert isinstance(overhead, float) and 0 <= overhead < (stall - ttfb) / 2, attributes


async def queued_behind_a_stall(url: str, ca_file: str, stall: float, requests: int) -> None:
    """``requests`` aiohttp requests through a pool of two connections; the loop is blocked for
    ``stall`` s while the first two are opening theirs and the rest wait for one."""
    connecting = AllConnecting(expected=2)
    trace = aiohttp.TraceConfig()
    trace.on_connection_create_start.append(connecting.one_more)
    context = ssl.create_default_context(cafile=ca_file)
    connector = aiohttp.TCPConnector(limit=2, ssl=context)
    async with aiohttp.ClientSession(connector=connector, trace_configs=[trace]) as session:

        async def one() -> None:
            async with session.post(url, json={}) as response:
                await response.read()

        async def stall_the_loop() -> None:
            await connecting.event.wait()
            await asyncio.sleep(0.01)  # the other requests are queued by now
            time.sleep(stall)  # noqa: ASYNC251 - the program's own stall under test

        await asyncio.gather(stall_the_loop(), *(one() for _ in range(requests)))


def test_a_stall_that_holds_the_pool_is_the_queued_requests_lag(telemetry: Telemetry) -> None:
    """Six requests, two connections, a 0.3 s stall while the two are in their handshake (the
    server answers after 0.1 s): the two end 0.2 s late, and so does the turn of every request
    queued behind them, even the ones whose turn comes long after the stall (each holds its
    connection 0.05 s at least, the server's time). Their queue was the program's too.

    A queued request is charged the lag of the one whose end gave it its turn when that turn
    came within 20 ms of the end: a run whose queue lag misses its bound by no more than what
    the machine measurably took meanwhile (this process's and the server's run-queue waits,
    the collector's pauses: a thread kept from a CPU between the end and the turn, or the
    machine's share of the stall, which the product counts as descheduled, not lag) runs again,
    up to TRIES times. Any other miss fails at once."""
    delay, stall, ttfb, requests = 0.1, 0.3, 0.05, 6
    arguments = ("--tls", "--tls-delay", str(delay), "--ttfb", str(ttfb), "--tokens", "1")
    for _ in range(TRIES):
        telemetry.exporter.clear()  # a run again: only its own attempts
        with mock_server(*arguments) as mock:
            assert mock.ca_file is not None
            with machine_waits(mock.process.pid) as waited, collector_pauses() as collected:
                asyncio.run(queued_behind_a_stall(mock.url, mock.ca_file, stall, requests))
        attempts = telemetry.attempts()
        assert len(attempts) == requests
        phases = [check_attempt(telemetry, attempt, fresh=False) for attempt in attempts]
        queued = [found for found in phases if "queue" in found]
        assert len(queued) == requests - 2, queued
        for found in queued:
            # Its turn came at least the stall, less the handshake's own time, late.
            assert found["queue"][0] >= stall - delay, found
        lags = [found["queue"][1] for found in queued]
        missed = (stall - delay) / 2 - min(lags)
        if missed <= 0 or missed > waited.total + collected.seconds:
            break
    for found in queued:
        assert found["queue"][1] >= (stall - delay) / 2, (
            f"{found}; {waited}, the garbage collector ran {collected.seconds:.3f} s"
        )
