"""A loop the machine took the CPU from is not a loop busy with the program's code.

The test's event loop runs on CPU 0 only; ten aiohttp requests go out to ``llm-latency
mock-server`` (its own process, on CPU 1, answering after 0.3 s), and then a helper process on
CPU 0 runs at real-time priority (``SCHED_FIFO``) for 0.4 s: the loop's thread is runnable but
gets no CPU, as on a node whose noisy neighbours take the cores. The answers wait in the socket
buffers meanwhile. The kernel counts that wait (``/proc/thread-self/schedstat``): the product
leaves it out of ``llm_latency.event_loop.lag`` and out of ``llm_latency.network_overhead``,
reports it as ``llm_latency.event_loop.descheduled``, and ``diagnose()`` blames neither the
program's loop nor the network.

Every bound is a share of the injected starvation.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
import pytest

import llm_latency
from tests.command_line import mock_server
from tests.conftest import Telemetry

pytestmark = pytest.mark.xdist_group("timing")

REQUESTS = 10
STARVED = 0.4
LAG = "llm_latency.event_loop.lag"
DESCHEDULED = "llm_latency.event_loop.descheduled"
OVERHEAD = "llm_latency.network_overhead"

#: Waits on CPU 0 for a line, then spins at real-time priority there for STARVED seconds.
BURNER = """
import os, sys, time
os.sched_setaffinity(0, {0})
sys.stdin.readline()
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    pass
"""


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


@pytest.mark.skipif(sys.platform != "linux", reason="the run-queue wait is Linux's")
def test_a_loop_without_a_cpu_is_the_machines_wait_not_the_programs_lag(
    telemetry: Telemetry,
) -> None:
    assert {0, 1} <= os.sched_getaffinity(0)  # two CPUs: one for the loop, one for the server
    with mock_server("--ttfb", "0.3", "--tokens", "1") as mock:
        os.sched_setaffinity(mock.process.pid, {1})
        burner = subprocess.Popen(
            [sys.executable, "-c", BURNER, str(STARVED)], stdin=subprocess.PIPE, text=True
        )
        try:
            with on_cpu_zero():
                asyncio.run(requests_starved(mock.url, burner))
        finally:
            burner.communicate(timeout=30)
        assert burner.returncode == 0  # it did run at real-time priority
    attempts = telemetry.attempts()
    assert len(attempts) == REQUESTS
    for attempt in attempts:
        attributes = dict(attempt.attributes or {})
        descheduled, lag = attributes.get(DESCHEDULED, 0.0), attributes.get(LAG)
        assert isinstance(descheduled, float) and isinstance(lag, float), attributes
        # The starvation began 0.1 s in; the answers came at 0.3 s: the 0.2 s of it after
        # them held them back. It was the machine's wait.
        assert descheduled >= (STARVED - 0.2) / 2, attributes
        # The program itself did little: what is left as its lag is not the starvation.
        assert lag < STARVED / 4, attributes
        # Nor is the network's: the send-to-first-byte window less the server's time was the
        # starvation after the answers came, and the overhead keeps at most a quarter of it.
        overhead = attributes.get(OVERHEAD)
        assert isinstance(overhead, float) and 0 <= overhead < (STARVED - 0.2) / 4, attributes
    rules = [finding.rule for finding in llm_latency.diagnose(telemetry.spans())]
    assert "event-loop-lag" not in rules
    assert "network-overhead" not in rules
    assert "short-of-cpu" in rules  # the machine's, said as such
