"""How long the machine kept a test's own thread, or a peer process of the test, from a CPU:
the kernel's run-queue wait (the second field of ``schedstat``, ns), the measure the product's
``llm_latency.event_loop.descheduled`` is made of (``llm_latency.cpu_wait``). A timing test
reads it around what it times, to tell a miss the machine caused from one the feature did."""

from __future__ import annotations

import contextlib
import gc
import glob
import time
from collections.abc import Iterator
from dataclasses import dataclass


def _waited_ns(pattern: str) -> int:
    """The run-queue wait (ns) summed over the ``schedstat`` files matching ``pattern``; a
    thread that ended between the listing and the read counts nothing."""
    total = 0
    for path in glob.glob(pattern):
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(path, encoding="ascii") as file:
                total += int(file.read().split()[1])
    return total


def this_thread_ns() -> int:
    """The calling thread's run-queue wait so far (ns)."""
    return _waited_ns("/proc/thread-self/schedstat")


def process_ns(pid: int) -> int:
    """Process ``pid``'s run-queue wait so far (ns), over all its threads."""
    return _waited_ns(f"/proc/{pid}/task/*/schedstat")


@dataclass
class Waited:
    """What the machine took while a block ran (s): from the thread that ran it, and from the
    peer processes given (a mock server's)."""

    thread: float = 0.0
    peers: float = 0.0

    @property
    def total(self) -> float:
        return self.thread + self.peers

    def __str__(self) -> str:
        return (
            f"the machine kept this thread from a CPU for {self.thread:.3f} s and the peer "
            f"process(es) for {self.peers:.3f} s"
        )


@contextlib.contextmanager
def machine_waits(*pids: int) -> Iterator[Waited]:
    """The run-queue waits of this thread and of the processes ``pids`` while the block runs,
    filled in when it ends."""
    waited = Waited()
    thread, peers = this_thread_ns(), sum(process_ns(pid) for pid in pids)
    try:
        yield waited
    finally:
        waited.thread = (this_thread_ns() - thread) / 1e9
        waited.peers = max(sum(process_ns(pid) for pid in pids) - peers, 0) / 1e9


@dataclass
class Collected:
    """How long the cyclic garbage collector held the process while a block ran (s): a
    collection of a test worker's whole heap (half a million objects) takes a second on a
    loaded 2-core machine, holding the GIL, in whichever thread it started."""

    seconds: float = 0.0


@contextlib.contextmanager
def collector_pauses() -> Iterator[Collected]:
    """The time the garbage collector ran while the block runs (``gc.callbacks``)."""
    collected = Collected()
    started: list[float] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            collected.seconds += time.perf_counter() - started.pop()

    gc.callbacks.append(note)
    try:
        yield collected
    finally:
        gc.callbacks.remove(note)
