"""How long a thread waited for a CPU: the time the kernel kept it runnable but not running.

A late tick of the event-loop monitor says the loop did not run when it was due, not why. Two
causes look alike from the clock and need opposite fixes: the program's own code held the loop
(CPU work between awaits, a blocking call), or the machine had no core for the process (other
processes, a container's CPU limit, a node's noisy neighbours). Linux counts the second one per
thread: the second field of ``/proc/thread-self/schedstat`` is the time spent on a run queue,
waiting for a CPU. Read before and after a late stretch, it gives the stretch's share that was
the machine's, not the program's.

A process stopped by a signal (``SIGSTOP``, a debugger) or a thread waiting for the GIL is not
runnable: the kernel counts no CPU wait for it, and that time stays the program's.

The file belongs to a thread, so its reader does too: :func:`clock_of_this_thread` opens one
per thread, at the thread's first read, and it is closed when the thread ends (its
thread-local state goes with it). Whoever reads it (the lag monitor of whichever loop the
thread runs now) holds none: a thread per job, each with its own loop, leaves no file behind.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from typing import Final

from llm_latency import forks
from llm_latency.live_state import register

#: The current thread's scheduler statistics: time on a CPU, time waiting on a run queue (ns),
#: time slices run.
SCHEDSTAT: Final = "/proc/thread-self/schedstat"

#: The files open now, one per thread that read its wait (``live_state()["cpu_wait_readers"]``).
_open: set[int] = set()
register("cpu_wait_readers", lambda: len(_open))
_serials = itertools.count()


class CpuWaitClock:
    """The run-queue wait (ns) of the thread that made it, read cheaply (one ``pread``).
    ``serial`` tells two clocks apart (never reused, unlike ``id()``)."""

    __slots__ = ("_fd", "serial")

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.serial = next(_serials)
        _open.add(fd)

    @classmethod
    def of_this_thread(cls) -> CpuWaitClock | None:
        """A clock for the calling thread, or None where the kernel does not tell (not Linux,
        a kernel without schedstats)."""
        try:
            fd = os.open(SCHEDSTAT, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        clock = cls(fd)
        if clock.read() is None:
            clock.close()
            return None
        return clock

    def read(self) -> int | None:
        """The thread's total run-queue wait so far (ns), None if it cannot be read."""
        try:
            fields = os.pread(self._fd, 128, 0).split()
            return int(fields[1])
        except (OSError, IndexError, ValueError):
            return None

    def close(self) -> None:
        """Let go of the file (the clock reads nothing after)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            _open.discard(fd)
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        try:  # noqa: SIM105 (contextlib may be gone: the end of the interpreter clears modules)
            self.close()
        except Exception:
            pass


class _ThisThread(threading.local):
    """Each thread's clock (an attribute set at its first read, in that thread)."""

    clock: CpuWaitClock | None


_threads = _ThisThread()


def clock_of_this_thread() -> CpuWaitClock | None:
    """The calling thread's clock, opened at its first call in the thread and closed when the
    thread ends; None where the kernel does not tell."""
    try:
        return _threads.clock
    except AttributeError:
        clock = _threads.clock = CpuWaitClock.of_this_thread()
        return clock


@forks.at_fork
def _reopen_in_child() -> None:
    # The forking thread's file is the parent thread's (/proc/thread-self named it at the
    # open): the child's thread opens its own at its next read. The other threads' clocks went
    # with their threads.
    clock = _threads.__dict__.pop("clock", None)
    if clock is not None:
        clock.close()
