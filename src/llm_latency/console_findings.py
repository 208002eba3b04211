"""The console exporter's findings: the diagnosis of the calls of a window, each finding printed
once, when it appears, and what the window shows at exit.

One call at a time, the diagnosis misses what only many calls show (a burst through a pool too
small for it: each call waited, none alone says why) and has nothing to say after each healthy
call. So the finished calls are kept in a window (those of the last :data:`WINDOW` seconds, at
most :data:`MAX_CALLS`), and the window is diagnosed as calls finish. A finding is printed when
its rule appears, not again while it holds (a rule that disappears and comes back is printed
again). At exit the window is diagnosed once more, and the findings that only appear then or
whose lines changed since they were printed (the same cause, counted over more calls) are
printed with what the whole window shows.

The diagnosis costs more as the window fills, and the exporter may run on the program's own
thread or event loop: after a diagnosis that took ``t``, the next waits until ``t / BUSY_SHARE``
has passed since it began, so the diagnosis takes at most :data:`BUSY_SHARE` of the program's
time; calls that finish in between are diagnosed with the next, or at exit.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final

from llm_latency.call_tree import finding_lines
from llm_latency.diagnosis import diagnose
from llm_latency.diagnosis.findings import Finding
from llm_latency.diagnosis.records import Call

#: The calls diagnosed together: those that finished in the last this many seconds...
WINDOW: Final = 300.0
#: ... at most this many (the most recent).
MAX_CALLS: Final = 1000
#: The most of the program's time the diagnosis takes (see the module docstring).
BUSY_SHARE: Final = 0.1


class FindingsWindow:
    """The calls of the window and the findings printed so far. Not thread-safe: the exporter
    holds its lock around each use."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        #: The finished calls, oldest first, each with the time it was added.
        self._calls: deque[tuple[float, Call]] = deque(maxlen=MAX_CALLS)
        #: The lines printed for each rule, while the rule holds.
        self._printed: dict[str, list[str]] = {}
        self._next = 0.0
        self._pending = False

    def add(self, calls: Sequence[Call], width: int | None) -> list[str]:
        """Add the calls that just finished; the lines of the findings that appear with them
        (none while the last diagnosis is too recent: see :data:`BUSY_SHARE`)."""
        if not calls:
            return []
        now = self._clock()
        self._calls.extend((now, call) for call in calls)
        self._pending = True
        if now < self._next:
            return []
        findings = self._diagnose(now)
        appeared = [f for f in findings if f.rule not in self._printed]
        self._printed = {
            f.rule: self._printed.get(f.rule) or finding_lines([f], width) for f in findings
        }
        return self._block(appeared, width, "")

    def at_exit(self, width: int | None) -> list[str]:
        """The lines of the findings of the window at exit that were not printed as they are
        now; a line that says there were none when no finding was ever printed."""
        if not self._calls:
            return []
        holding = bool(self._printed)  # what the last diagnosis found, as printed
        findings = self._diagnose(self._clock()) if self._pending else []
        changed = [f for f in findings if self._printed.get(f.rule) != finding_lines([f], width)]
        if not findings and not holding:
            return [f"llm-latency: no findings over the last {_calls(len(self._calls))}, at exit"]
        return self._block(changed, width, ", at exit")

    def _diagnose(self, now: float) -> list[Finding]:
        while self._calls and self._calls[0][0] < now - WINDOW:
            self._calls.popleft()
        began = time.perf_counter()
        findings = diagnose([call for _, call in self._calls])
        took = time.perf_counter() - began
        self._next = now + took / BUSY_SHARE
        self._pending = False
        return findings

    def _block(self, findings: list[Finding], width: int | None, when: str) -> list[str]:
        if not findings:
            return []
        head = f"llm-latency: findings over the last {_calls(len(self._calls))}{when}:"
        return [head, *finding_lines(findings, width)]


def _calls(count: int) -> str:
    return "call" if count == 1 else f"{count} calls"
