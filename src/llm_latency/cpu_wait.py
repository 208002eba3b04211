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
"""

from __future__ import annotations

import contextlib
import os
from typing import Final

#: The current thread's scheduler statistics: time on a CPU, time waiting on a run queue (ns),
#: time slices run.
SCHEDSTAT: Final = "/proc/thread-self/schedstat"


class CpuWaitClock:
    """The run-queue wait (ns) of the thread that made it, read cheaply (one ``pread``)."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

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
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        self.close()
