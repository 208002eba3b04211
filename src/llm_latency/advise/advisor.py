"""The findings service's state: spans in, and every interval the diagnosis of each window.

:meth:`Advisor.receive` is called by the HTTP threads with the spans of each export request;
:meth:`Advisor.run_diagnosis`, every interval, reads the settled traces into calls, lets the
old calls go, and runs :func:`~llm_latency.diagnosis.diagnose` on each (service, host) window.
What it found is a :class:`Snapshot`, replaced whole: the metrics and the page read the last
one without a lock.

What a finding saves is given three ways (:class:`Advice`): the seconds of the calls' time the
fix removes from the window's calls (the saving's p50 on the requests it concerns), that over
the calls' time in the window (a share: the alert's measure), and that per minute of the
stretch of time the window covers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from llm_latency.advise.windows import Assembler, Key, Windows
from llm_latency.diagnosis import diagnose
from llm_latency.diagnosis.findings import Finding
from llm_latency.diagnosis.records import Call, SpanRecord


@dataclass(frozen=True)
class Settings:
    """How the service keeps and reads its calls (``llm-latency advise``'s options)."""

    #: Seconds of calls each window keeps (the sliding window's length).
    window: float = 300.0
    #: Seconds between two diagnoses.
    interval: float = 15.0
    #: Calls kept per (service, host) at most, and (service, host) keys at most.
    per_key: int = 2000
    max_keys: int = 50
    #: A trace is read into calls when no span of it came for this long (s), or at this age.
    settle: float = 5.0
    max_age: float = 60.0
    #: Spans held for unsettled traces at most.
    max_pending: int = 200_000
    #: Seconds a span may take to arrive after its call ended (the SDK's batch delay, 5 s by
    #: default, then the Collector's batches): see :func:`complete`.
    delay: float = 10.0


@dataclass(frozen=True)
class Advice:
    """One finding of one window, with what its fix saves there."""

    service: str
    host: str
    finding: Finding
    #: Seconds of the calls' time the fix removes, over the window's calls.
    saved: float
    #: ``saved`` over the calls' time in the window (0 to 1).
    share: float
    #: ``saved`` per minute of the time the window covers.
    per_minute: float
    #: The calls in the window, and the seconds of time they cover.
    calls: int
    covered: float

    @property
    def rule(self) -> str:
        """The finding's rule id."""
        return self.finding.rule


@dataclass(frozen=True)
class WindowState:
    """One window at the last diagnosis: its key, how many calls, over how many seconds."""

    service: str
    host: str
    calls: int
    covered: float


@dataclass(frozen=True)
class Snapshot:
    """What the last diagnosis found (``at``: seconds since the epoch; 0 before the first)."""

    at: float = 0.0
    advice: tuple[Advice, ...] = ()
    windows: tuple[WindowState, ...] = ()
    #: The CPU seconds the last diagnosis took (the thread's own time).
    cpu_seconds: float = 0.0
    spans_received: int = 0
    calls_dropped: int = 0
    pending_spans: int = 0
    diagnoses: int = 0
    errors: int = 0


class Advisor:
    """Bounded windows of calls fed by spans, and the findings of their last diagnosis."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        s = self.settings
        self._lock = threading.Lock()
        self._assembler = Assembler(s.settle, s.max_age, s.max_pending)
        self._windows = Windows(s.window, s.per_key, s.max_keys)
        self._received = 0
        self._diagnoses = 0
        self._errors = 0
        self.snapshot = Snapshot()

    def receive(self, spans: Sequence[SpanRecord]) -> None:
        """Holds the spans of one export request until their traces settle."""
        with self._lock:
            self._received += len(spans)
            early = self._assembler.add(spans, time.monotonic())
            self._windows.add(early)

    def add_calls(self, calls: Iterable[Call]) -> None:
        """Adds finished calls to their windows directly (the soak bench feeds them so)."""
        with self._lock:
            self._windows.add(calls)

    def run_diagnosis(self, now_ns: int | None = None, *, everything: bool = False) -> Snapshot:
        """Reads the settled traces, lets the calls older than the window go, diagnoses each
        window's :func:`complete` calls and publishes the :class:`Snapshot`; ``everything``:
        every trace and every call, as at the end of a run."""
        cpu = time.thread_time()
        now_ns = time.time_ns() if now_ns is None else now_ns
        with self._lock:
            self._windows.add(self._assembler.settled(time.monotonic(), everything))
            self._windows.expire(now_ns)
            windows = self._windows.snapshot()
            received, dropped = self._received, self._windows.dropped
            pending = self._assembler.pending
        advice: list[Advice] = []
        states: list[WindowState] = []
        for key, every_call in sorted(windows.items()):
            states.append(
                WindowState(*key, len(every_call), _covered(every_call, now_ns, self.settings))
            )
            calls = every_call if everything else complete(every_call, now_ns, self.settings)
            if not calls:
                continue
            covered = _covered(calls, now_ns, self.settings)
            try:
                findings = diagnose(calls)
            except Exception:  # one window's bad data must not stop the others' diagnosis
                self._errors += 1
                continue
            advice += advice_of(key, findings, calls, covered)
        self._diagnoses += 1
        self.snapshot = Snapshot(
            at=now_ns / 1e9,
            advice=tuple(advice),
            windows=tuple(states),
            cpu_seconds=time.thread_time() - cpu,
            spans_received=received,
            calls_dropped=dropped,
            pending_spans=pending,
            diagnoses=self._diagnoses,
            errors=self._errors,
        )
        return self.snapshot


def complete(calls: Sequence[Call], now_ns: int, settings: Settings) -> list[Call]:
    """The calls that started before the others of their time could still be on their way:
    a call that ran beside them and is still running, or whose spans are still in a batch
    or an unsettled trace, would be missing from the diagnosis, which would see fewer calls at
    once than there were (a pool of 30 in flight read as 10). The horizon is the window's
    longest call, the spans' :attr:`Settings.delay` and :attr:`Settings.settle` before now."""
    if not calls:
        return []
    longest = max(call.duration for call in calls)
    horizon = now_ns - int((longest + settings.delay + settings.settle) * 1e9)
    return [call for call in calls if call.start_ns <= horizon]


def _covered(calls: Sequence[Call], now_ns: int, settings: Settings) -> float:
    """The seconds a window covers: from its oldest call's start to now, within the window's
    length, and no less than one interval (a single burst is not a rate over a few seconds)."""
    oldest = min(call.start_ns for call in calls)
    return min(max((now_ns - oldest) / 1e9, settings.interval), settings.window)


def advice_of(
    key: Key, findings: Sequence[Finding], calls: Sequence[Call], covered: float
) -> list[Advice]:
    """The findings of one window with what each saves there."""
    busy = sum(call.duration for call in calls)
    advice = []
    for finding in findings:
        saved = finding.saving.total if finding.saving is not None else 0.0
        share = min(saved / busy, 1.0) if busy > 0 else 0.0
        per_minute = saved / covered * 60.0
        advice.append(Advice(*key, finding, saved, share, per_minute, len(calls), covered))
    return advice
