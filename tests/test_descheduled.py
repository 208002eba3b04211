"""A loop the machine took the CPU from is not a loop busy with the program's code.

The test's event loop runs on CPU 0 only; ten aiohttp requests go out to ``llm-latency
mock-server`` (its own process, on CPU 1, answering after 0.3 s), and then a helper process on
CPU 0 runs at real-time priority (``SCHED_FIFO``): the loop's thread is runnable but gets no
CPU, as on a node whose noisy neighbours take the cores. The answers wait in the socket
buffers meanwhile. The kernel counts that wait (``/proc/thread-self/schedstat``): the product
leaves it out of ``llm_latency.event_loop.lag`` and out of ``llm_latency.network_overhead``,
reports it as ``llm_latency.event_loop.descheduled`` (on the request span, and each phase's
share on its span: here the wait's, whose end, the answer's first byte, the starved loop read
late), and ``diagnose()`` blames neither the program's loop nor the network.

The starvation is measured as it happened, not assumed from a schedule: on a loaded machine
the server (on a CPU where every other runnable task crowds while CPU 0 is taken) can answer
after a starvation of fixed length has ended, and then nothing the requests waited for was held
back. So the helper holds CPU 0 from the test's signal until every answer is in the loop's
socket buffers (the kernel's socket table, ``/proc/net/tcp``, shows their unread bytes), then
:data:`HELD` longer, and says when each happened. Every bound is a share of the starvation so
measured. A run in which the answers did not come while the helper held CPU 0 (it gave up after
:data:`LONGEST`), or in which the loop's thread measurably did not wait for a CPU that long,
tested nothing: it runs again, up to :data:`TRIES` times.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import aiohttp
import pytest
from opentelemetry.sdk.trace import ReadableSpan

import llm_latency
from llm_latency.diagnosis.claims import over_claimed
from tests.checks import TRIES
from tests.command_line import Mock, mock_server
from tests.conftest import Telemetry
from tests.cpu_waits import this_thread_ns

pytestmark = pytest.mark.xdist_group("timing")

REQUESTS = 10
#: How long CPU 0 stays taken once every answer is in the loop's socket buffers (s).
HELD = 0.2
#: The longest the helper waits for the answers before it gives CPU 0 back (s): from the
#: signal, 0.1 s after the requests start, they are due in about 0.2 s. Under the kernel's
#: real-time budget (0.95 s of each second) with HELD.
LONGEST = 0.5
LAG = "llm_latency.event_loop.lag"
DESCHEDULED = "llm_latency.event_loop.descheduled"
OVERHEAD = "llm_latency.network_overhead"

#: Takes real-time priority on CPU 0, says so, and waits for a line (blocked: no CPU taken, and
#: woken at once when it comes). Then spins until the test's REQUESTS connections to the
#: server's port all hold unread bytes (established or closed by the server: state 01 or 08,
#: rx_queue above 0), at most LONGEST s, then HELD s more; prints when it began, when the
#: answers were all in (or -1) and when it ended (``time.monotonic``).
BURNER = """
import os, sys, time
port, requests, longest, held = int(sys.argv[1]), int(sys.argv[2]), *map(float, sys.argv[3:])
os.sched_setaffinity(0, {0})
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
print("ready", flush=True)
if not sys.stdin.readline():
    sys.exit(1)
began = time.monotonic()

def answered():
    with open("/proc/net/tcp") as table:
        rows = [row.split() for row in table.readlines()[1:]]
    waiting = [r for r in rows if r[3] in ("01", "08") and int(r[2].split(":")[1], 16) == port
               and int(r[4].split(":")[1], 16) > 0]
    return len(waiting) >= requests

arrived = -1.0
while time.monotonic() < began + longest:
    if answered():
        arrived = time.monotonic()
        break
end = time.monotonic() + (held if arrived >= 0 else 0)
while time.monotonic() < end:
    pass
print(began, arrived, time.monotonic(), flush=True)
"""


@dataclass
class Starvation:
    """When the helper took CPU 0, when every answer was in the loop's socket buffers (None if
    they never were while it held the CPU) and when it gave CPU 0 back (its monotonic s);
    and how long the loop's thread waited for a CPU in the run (s, the kernel's count)."""

    began: float
    answered: float | None
    ended: float
    loop_waited: float

    @property
    def starved(self) -> float:
        """How long the loop had no CPU."""
        return self.ended - self.began

    @property
    def held(self) -> float:
        """How long the answers waited in the socket buffers for the starved loop (0 if
        they did not come while it was starved)."""
        return 0.0 if self.answered is None else self.ended - self.answered

    def tested(self) -> bool:
        """Whether the run starved the loop as the test means: the answers waited through a
        starvation, and the kernel saw the loop's thread wait for a CPU at least that long."""
        return self.held >= HELD and self.loop_waited >= self.held

    def __str__(self) -> str:
        answered = "never" if self.answered is None else f"{self.answered - self.began:.3f} s"
        return (
            f"CPU 0 taken for {self.starved:.3f} s, the answers in at {answered}, held "
            f"{self.held:.3f} s; the loop's thread waited for a CPU {self.loop_waited:.3f} s"
        )


@contextmanager
def on_cpu_zero() -> Iterator[None]:
    """The calling thread (the test's event loop) runs on CPU 0 only, in the block."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


async def requests_starved(url: str, burner: subprocess.Popen[str]) -> None:
    """REQUESTS concurrent requests; once they are out, the burner takes CPU 0."""
    async with aiohttp.ClientSession() as session:

        async def one() -> None:
            async with session.post(url, json={}) as response:
                await response.read()

        async def starve() -> None:
            await asyncio.sleep(0.1)  # every request is out, the answers are 0.2 s away
            assert burner.stdin is not None
            burner.stdin.write("go\n")
            burner.stdin.flush()

        await asyncio.gather(starve(), *(one() for _ in range(REQUESTS)))


def starved_run(mock: Mock) -> Starvation:
    """The requests to ``mock``, with the burner on CPU 0 once they are out."""
    port = mock.url.split(":")[2].split("/")[0]
    burner = subprocess.Popen(
        [sys.executable, "-c", BURNER, port, str(REQUESTS), str(LONGEST), str(HELD)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert burner.stdout is not None
        ready = burner.stdout.readline()  # at real-time priority, before any request
        assert ready == "ready\n", ready + (burner.stderr.read() if burner.stderr else "")
        with on_cpu_zero():
            waited = this_thread_ns()
            asyncio.run(requests_starved(mock.url, burner))
            waited = this_thread_ns() - waited
    finally:
        out, err = burner.communicate(timeout=30)
    assert burner.returncode == 0, err
    began, answered, ended = map(float, out.split())
    return Starvation(began, answered if answered >= 0 else None, ended, waited / 1e9)


def phase_shares(telemetry: Telemetry, attempt: ReadableSpan) -> dict[str, float]:
    """The machine's share of each phase of ``attempt`` that carries one (s, by phase name):
    the attribute is written only above 0."""
    shares = {}
    for name, span in telemetry.phases(attempt).items():
        share = (span.attributes or {}).get(DESCHEDULED)
        if share is not None:
            assert isinstance(share, float) and share > 0, (name, share)
            shares[name] = share
    return shares


@pytest.mark.skipif(sys.platform != "linux", reason="the run-queue wait is Linux's")
def test_a_loop_without_a_cpu_is_the_machines_wait_not_the_programs_lag(
    telemetry: Telemetry,
) -> None:
    assert {0, 1} <= os.sched_getaffinity(0)  # two CPUs: one for the loop, one for the server
    with mock_server("--ttfb", "0.3", "--tokens", "1") as mock:
        os.sched_setaffinity(mock.process.pid, {1})
        for _ in range(TRIES):
            telemetry.exporter.clear()  # a run again: only its own spans
            starvation = starved_run(mock)
            if starvation.tested():
                break
    assert starvation.tested(), (
        f"the machine never let the starvation hold the answers: {starvation}"
    )
    attempts = telemetry.attempts()
    assert len(attempts) == REQUESTS
    for attempt in attempts:
        attributes = dict(attempt.attributes or {})
        descheduled, lag = attributes.get(DESCHEDULED, 0.0), attributes.get(LAG)
        assert isinstance(descheduled, float) and isinstance(lag, float), attributes
        # The answers waited for the starved loop: it was the machine's wait.
        assert descheduled >= starvation.held / 2, f"{starvation}; {attributes}"
        # The program itself did little: what is left as its lag is not the starvation.
        assert lag < starvation.starved / 4, f"{starvation}; {attributes}"
        # Nor is the network's: the send-to-first-byte window less the server's time held the
        # starvation the answers waited through, and the overhead keeps at most a quarter of it.
        overhead = attributes.get(OVERHEAD)
        assert isinstance(overhead, float), attributes
        assert 0 <= overhead < starvation.held / 4, f"{starvation}; {attributes}"
        # Each phase span carries its share, together no more than the attempt's. The
        # starvation held the answers while the attempts waited for them: at least half of it
        # is the wait's, whose end (the first byte) it delayed.
        shares = phase_shares(telemetry, attempt)
        assert sum(shares.values()) <= descheduled + 1e-9, f"{shares}; {attributes}"
        assert sum(shares.values()) >= starvation.held / 2, f"{starvation}; {shares}"
        assert shares.get("wait", 0.0) >= starvation.held / 2, f"{starvation}; {shares}"
    findings = llm_latency.diagnose(telemetry.spans())
    rules = [finding.rule for finding in findings]
    assert "event-loop-lag" not in rules
    assert "network-overhead" not in rules
    assert "short-of-cpu" in rules  # the machine's, said as such
    assert over_claimed(findings) == []  # and no other finding counts its seconds
