"""How long the machine kept a test's own thread, or a peer process of the test, from a CPU:
the kernel's run-queue wait (the second field of ``schedstat``, ns), the measure the product's
``llm_latency.event_loop.descheduled`` is made of (``llm_latency.cpu_wait``). A timing test
reads it around what it times, to tell a miss the machine caused from one the feature did."""

from __future__ import annotations

import contextlib
import gc
import glob
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field


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


#: How often :func:`sampled_waits` reads the threads' counts (s).
SAMPLE_EVERY = 0.02


@dataclass
class Sampled:
    """The run-queue waits of every thread of some processes while a block ran, read every so
    often: a thread or a process that ended within the block counts what it had waited at its
    last reading (the end of its life, at most one interval, is missed).
    ``first`` and ``last``: each thread's count (ns) at its first and last reading, by (process,
    thread) id; a thread first read after the block began started within it, from 0."""

    first: dict[tuple[int, int], int] = field(default_factory=dict)
    last: dict[tuple[int, int], int] = field(default_factory=dict)
    #: The thread that reads (its own waits are not the watched program's).
    reader: int = 0

    def of(self, pid: int) -> float:
        """What the machine kept process ``pid``'s threads from a CPU, summed (s)."""
        return sum(self.last[key] - self.first[key] for key in self.last if key[0] == pid) / 1e9

    @property
    def processes(self) -> dict[int, float]:
        """Each process's summed wait (s), by id."""
        return {pid: self.of(pid) for pid in sorted({pid for pid, _ in self.last})}

    @property
    def total(self) -> float:
        """Every thread's wait, summed (s)."""
        return sum(self.last[key] - self.first[key] for key in self.last) / 1e9

    def read(self, pids: list[int], started: bool) -> None:
        """One reading of every thread of ``pids``."""
        for pid in pids:
            for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
                thread = int(path.split("/")[4])
                if thread == self.reader:
                    continue
                with contextlib.suppress(OSError, IndexError, ValueError):
                    with open(path, encoding="ascii") as file:
                        waited = int(file.read().split()[1])
                    key = (pid, thread)
                    self.first.setdefault(key, 0 if started else waited)
                    self.last[key] = waited


def descendants(pid: int) -> list[int]:
    """The processes whose parent, or an ancestor's parent, is ``pid``, now."""
    parents: dict[int, int] = {}
    for path in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(path, encoding="ascii", errors="replace") as file:
                fields = file.read().rsplit(")", 1)[1].split()
            parents[int(path.split("/")[2])] = int(fields[1])
    found: list[int] = []
    frontier = [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


@contextlib.contextmanager
def sampled_waits(
    *pids: int, with_children: bool = False, every: float = SAMPLE_EVERY
) -> Iterator[Sampled]:
    """The run-queue waits of every thread of the processes ``pids`` (and of their descendants
    at the start, ``with_children``) while the block runs, read in a thread of this process
    every ``every`` s (see :class:`Sampled`): for processes or threads that may end before the
    block does, which :func:`machine_waits` reads only at both ends. Reading this process's
    own threads, read less often: each reading holds the GIL a little, and a reader kept from
    a CPU while it holds it holds the program's threads back."""
    watched = list(pids)
    if with_children:
        for pid in pids:
            watched += descendants(pid)
    sampled = Sampled()
    sampled.read(watched, started=False)
    done = threading.Event()

    def sample() -> None:
        sampled.reader = threading.get_native_id()
        while not done.wait(every):
            sampled.read(watched, started=True)

    sampler = threading.Thread(target=sample, name="cpu-waits-sampler", daemon=True)
    sampler.start()
    try:
        yield sampled
    finally:
        done.set()
        sampler.join()
        sampled.read(watched, started=True)
