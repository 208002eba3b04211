"""What llm-latency keeps per event loop and per thread ends with the loop and the thread.

A worker that runs each job in an event loop of its own (``asyncio.run()`` per job, a thread per
job, a loop closed or dropped with requests still in flight) holds no more open files, event
loops or objects after hundreds of jobs than the same worker without llm-latency, plus a small
constant, and finishes every job under a soft limit of 256 open files. The worker is
``tests/programs/loop_jobs.py``, in its own process (the file limit and whatever it leaks are
its own), run plain and instrumented side by side against ``llm-latency mock-server``.

And in this process: a loop run by one thread, then by another, reads the CPU wait of the
thread that runs it, and no thread's file outlives the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import llm_latency
from tests.command_line import mock_server
from tests.conftest import Telemetry

pytestmark = [pytest.mark.xdist_group("lifetimes"), pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "programs" / "loop_jobs.py"
#: The llm-latency under test (a worktree's, not the one installed).
SOURCE = Path(llm_latency.__file__).resolve().parents[1]
JOBS = 500
#: Jobs whose loop is closed with four requests in flight: each leaves what httpx's anyio
#: keeps of a task destroyed inside a cancel scope (its loop, a socket), plain or not.
ABANDONED = 30
#: What the instrumented worker may hold beyond the plain one: the main thread's CPU-wait file,
#: and what the last job's loops left (found closed at the next loop's first request).
FILES, LOOPS = 6, 2
#: Objects made since the warm-up jobs, beyond the plain worker's (measured: 4 to 5 after 480
#: jobs of four requests; 1 object kept per job would be 480).
OBJECTS = 250
#: The same, after jobs that abandon requests: the last job's attempts and their spans are kept
#: until the next loop's first request (measured: 580 to 650; 35 objects kept per job would be
#: 1,000).
ABANDONED_OBJECTS = 1_000


@pytest.fixture(scope="module")
def fast() -> Iterator[str]:
    """A mock server that answers at once: one token, no wait."""
    args = ("--ttfb", "0", "--tokens", "1", "--tokens-per-second", "100000")
    with mock_server(*args) as server:
        yield server.url


@pytest.fixture(scope="module")
def slow() -> Iterator[str]:
    """A mock server whose answers take 3 s (a job closes its loops well before), a streamed one
    sending its first token at once."""
    with mock_server("--ttfb", "0", "--tokens", "6", "--tokens-per-second", "2") as server:
        yield server.url


def stop(process: subprocess.Popen[str]) -> None:
    """Kill ``process`` if it still runs (a test that failed on the other worker's result)."""
    if process.poll() is None:
        process.kill()
        process.wait()


def run_worker(shape: str, loop: str, url: str, jobs: int) -> tuple[dict[str, Any], ...]:
    """The worker, plain and instrumented, at the same time: what each printed at its end."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SOURCE), str(ROOT)])}
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
    with contextlib.ExitStack() as stack:
        runs = []
        for setup in ("plain", "instrumented"):
            # To files: a worker whose destroyed tasks print their tracebacks fills a pipe.
            out = stack.enter_context(tempfile.TemporaryFile("w+"))
            err = stack.enter_context(tempfile.TemporaryFile("w+"))
            command = [sys.executable, str(PROGRAM), shape, loop, setup, url, str(jobs)]
            process = subprocess.Popen(command, env=env, stdout=out, stderr=err, text=True)
            stack.callback(stop, process)
            runs.append((process, out, err))
        results = []
        for process, out, err in runs:
            process.wait(timeout=500)
            out.seek(0)
            err.seek(0)
            assert process.returncode == 0, err.read()[-3000:]
            results.append(json.loads(out.read().strip().splitlines()[-1]))
        return tuple(results)


def no_more_than_plain(
    plain: dict[str, Any],
    instrumented: dict[str, Any],
    jobs: int,
    requests: int,
    objects: int = OBJECTS,
) -> None:
    """Every job done, plain and instrumented, and the instrumented worker holds what the plain
    one holds, plus the constants above."""
    assert (plain["jobs"], plain["error"]) == (jobs, None)
    assert (instrumented["jobs"], instrumented["error"]) == (jobs, None)
    assert instrumented["spans"] >= jobs * requests  # it was instrumented
    kinds = ("files", "loops", "closed_loops", "growth")
    held = {key: instrumented[key] - plain[key] for key in kinds}
    live = instrumented["live"]
    said = f"held beyond plain: {held}; plain: {plain}; instrumented: {instrumented}"
    assert held["files"] <= FILES, said
    assert held["loops"] <= LOOPS and held["closed_loops"] <= LOOPS, said
    assert held["growth"] <= objects, said
    assert live["loop_monitors"] <= LOOPS, said
    assert live["cpu_wait_readers"] <= 1, said  # the main thread's, if it ran a loop
    assert instrumented["schedstat_files"] <= 1, said


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_loop_per_job_leaves_nothing_behind(fast: str, loop: str) -> None:
    """500 ``asyncio.run()`` (``uvloop.run()``) jobs, each one request with aiohttp, httpx,
    httpx2 and the async openai SDK: the loop of each ends with the job."""
    plain, instrumented = run_worker("run", loop, fast, JOBS)
    no_more_than_plain(plain, instrumented, JOBS, 4)
    assert instrumented["live"]["attempts_in_flight"] == 0


def test_a_thread_per_job_leaves_no_thread_file(fast: str) -> None:
    """Each job in a thread of its own, with its own loop: the thread's CPU-wait file closes
    when the thread ends."""
    plain, instrumented = run_worker("thread", "asyncio", fast, JOBS)
    no_more_than_plain(plain, instrumented, JOBS, 4)
    assert instrumented["live"]["cpu_wait_readers"] == 0  # the main thread ran no loop
    assert instrumented["schedstat_files"] == 0


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_loop_closed_with_requests_in_flight(slow: str, loop: str) -> None:
    """Each job's loop closes with four requests in flight (aiohttp waiting for headers and
    reading a stream, httpx and httpx2 reading a stream): their attempts end with their loop,
    and nothing of them keeps the loop or its sockets."""
    plain, instrumented = run_worker("abandon", loop, slow, ABANDONED)
    no_more_than_plain(plain, instrumented, ABANDONED, 0, ABANDONED_OBJECTS)
    assert instrumented["live"]["attempts_in_flight"] <= 4  # the last job's, at most


def test_a_loop_dropped_unclosed_with_requests_in_flight(slow: str) -> None:
    """Each job's loop is dropped unclosed with two aiohttp requests in flight (reading a
    stream, waiting for headers): the collector takes the loop, its sockets and its tasks, as
    without llm-latency (asyncio's loop: uvloop keeps a loop dropped unclosed, plain or not)."""
    plain, instrumented = run_worker("drop", "asyncio", slow, ABANDONED)
    no_more_than_plain(plain, instrumented, ABANDONED, 0, ABANDONED_OBJECTS)
    assert instrumented["live"]["attempts_in_flight"] == 0
    assert instrumented["live"]["aiohttp_streams"] == 0


# -- in this process ----------------------------------------------------------------------------


def schedstat_threads() -> set[int]:
    """The threads whose scheduler statistics this process has open (their native ids)."""
    threads = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith("/schedstat"):
            threads.add(int(target.split("/")[-2]))
    return threads


def readable_schedstat() -> bool:
    try:
        with open("/proc/thread-self/schedstat") as stats:
            return len(stats.read().split()) >= 2
    except OSError:
        return False


@pytest.mark.skipif(not readable_schedstat(), reason="the kernel does not count CPU waits")
def test_a_loop_run_by_two_threads_reads_the_one_that_runs_it(
    telemetry: Telemetry, fast: str
) -> None:
    """One loop, run by a thread that then ends, then by another: the CPU wait read is the
    running thread's (its file is open while it runs the loop), and no file of an ended thread
    is left open."""
    loop = asyncio.new_event_loop()
    running: dict[str, tuple[int, set[int]]] = {}

    async def request() -> None:
        async with aiohttp.ClientSession() as session, session.get(fast) as response:
            await response.read()
        await asyncio.sleep(0.05)  # the lag monitor's last tick runs on this thread

    def run(name: str) -> None:
        loop.run_until_complete(request())
        running[name] = threading.get_native_id(), schedstat_threads()

    try:
        for name in ("first", "second"):
            thread = threading.Thread(target=run, args=(name,))
            thread.start()
            thread.join()
            me, open_then = running[name]
            assert me in open_then, (name, running)  # its own file was read
            assert me not in schedstat_threads(), (name, running)  # and closed at its end
    finally:
        loop.close()


@pytest.mark.skipif(not readable_schedstat(), reason="the kernel does not count CPU waits")
def test_a_forked_child_reads_its_own_thread(telemetry: Telemetry, fast: str) -> None:
    """The parent's thread read its CPU wait before the fork: the child's thread reads its own
    (the parent's file names the parent's thread)."""

    async def request() -> None:
        async with aiohttp.ClientSession() as session, session.get(fast) as response:
            await response.read()
        await asyncio.sleep(0.05)

    asyncio.run(request())
    assert threading.get_native_id() in schedstat_threads()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            asyncio.run(request())
            code = 0 if schedstat_threads() == {threading.get_native_id()} else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
