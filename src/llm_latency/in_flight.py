"""The attempts in flight of an instrumentation: one owner, and one way out of it.

An attempt enters its instrumentation's :class:`AttemptsInFlight` when it starts
(:meth:`~AttemptsInFlight.add`, which also counts it on the lag monitor of the event loop it runs
on) and leaves it once, by one of four doors:

- it ends: :meth:`~AttemptsInFlight.take` hands its record to the first caller, whoever that is
  (the hook that saw the response end, the one that saw it fail, a collected stream), and None
  to every later one: so an attempt is ended once;
- the plugin is uninstrumented: :meth:`~AttemptsInFlight.end_all` ends each attempt still open
  through that same end, since the hooks that would have ended them are gone;
- its event loop closed, or went, first: nothing can end it now (its task went with the loop),
  so it is forgotten, and the adapters told (:attr:`~AttemptsInFlight.on_forget`) to drop what
  they hold of it; its span, never ended, is not exported;
- the process forked: the child starts with none of its parent's attempts, which never end there
  (``http.client.active_requests`` would count them for good).

The lag an attempt's loop charged it is read once, as it ends (:func:`charge_loop_lag`), which
also takes it off the loop's monitor. :func:`llm_latency.live_state` counts the owners alive (one
per emitter, which alone holds it: ``emitters``) and their attempts (``attempts_in_flight``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Collection, Sequence
from typing import Final

from llm_latency import forks
from llm_latency.attempt_record import AttemptRecord
from llm_latency.event_loop import closed_in_flight, monitor_of_running_loop
from llm_latency.facts import LoopLag
from llm_latency.fault_log import FaultLog
from llm_latency.lag_monitor import LATE_NS
from llm_latency.live_state import register
from llm_latency.timeline import PHASE_NAMES, Timeline

#: The lag of an attempt whose loop was never busy while it was in flight.
_NO_LAG: Final = LoopLag((0.0,) * len(PHASE_NAMES))

#: Every owner alive: the current instrumentation's, and any an ended one left behind.
_OWNERS: weakref.WeakSet[AttemptsInFlight] = weakref.WeakSet()
register("emitters", lambda: len(_OWNERS))
register("attempts_in_flight", lambda: sum(len(owner._open) for owner in list(_OWNERS)))


@forks.at_fork
def _forget_attempts() -> None:
    # The parent's attempts in flight at the fork never end in the child, whose hooks would
    # find nothing of them: counted in http.client.active_requests, they would stay forever.
    for owner in list(_OWNERS):
        owner._open = {}


class AttemptsInFlight:
    """The attempts started and not ended yet of one instrumentation."""

    def __init__(self, faults: FaultLog) -> None:
        self._faults = faults
        self._open: dict[Timeline, AttemptRecord] = {}
        #: Called with the attempts forgotten because their event loop closed or went before
        #: they ended: an adapter drops what it holds of them (the body stream it owns).
        self.on_forget: list[Callable[[Collection[Timeline]], object]] = []
        _OWNERS.add(self)

    def add(self, record: AttemptRecord, on_loop: bool) -> None:
        """Count a started attempt in flight; ``on_loop``: it runs on the running asyncio loop,
        whose monitor watches it from now on."""
        self._open[record.timeline] = record
        if on_loop:
            monitor = monitor_of_running_loop()
            if monitor is not None:
                monitor.attempt_started()
                record.loop_monitor = monitor
            if closed_in_flight:  # a loop closed or went with attempts in flight (rare)
                self._forget_closed()

    def take(self, timeline: Timeline) -> AttemptRecord | None:
        """The attempt's record, out of flight: for the first call only (None for the next
        ones, and for an attempt forgotten or never started here)."""
        return self._open.pop(timeline, None)

    def in_flight(self) -> list[AttemptRecord]:
        """The attempts started and not ended yet (read when the SDK collects, from another
        thread)."""
        for _ in range(3):
            try:
                return list(self._open.values())
            except RuntimeError:  # the dictionary changed during the copy
                continue
        return []

    def end_all(self, end: Callable[[Timeline], object]) -> None:
        """End every attempt still in flight with ``end`` (the one that ends an attempt once:
        it takes the attempt out of flight)."""
        for timeline in list(self._open):
            end(timeline)

    def _forget_closed(self) -> None:
        """Forget the attempts in flight on the loops that closed or went before they ended.
        Nothing ends them now: their tasks went with the loop (or stay with whatever keeps
        them, never to run again), and their spans, never ended, are not exported. Kept, they
        would keep their spans and, through the adapters, the loop and its sockets."""
        try:
            closed = set()
            while closed_in_flight:
                closed.add(closed_in_flight.pop())
            abandoned = {t for t, r in list(self._open.items()) if r.loop_monitor in closed}
            for timeline in abandoned:
                self._open.pop(timeline, None)
            for forget in self.on_forget:
                forget(abandoned)
        except Exception:  # never break the host program
            self._faults.failed_once("forgetting the attempts of a closed event loop")


def charge_loop_lag(
    record: AttemptRecord, windows: Sequence[tuple[int, int, int]]
) -> LoopLag | None:
    """How long the attempt's busy event loop delayed the end of each of its phases and of
    each of its stream's longest gaps, and how long its thread waited for a CPU (in all, and
    the part that delayed each phase's end); None for an attempt not on a loop. Once per
    attempt: it takes the attempt off its loop's monitor."""
    monitor = record.loop_monitor
    if monitor is None:
        return None
    record.loop_monitor = None
    timeline = record.timeline
    delays = monitor.phase_delays(windows, len(PHASE_NAMES), lambda: timeline.arrivals(LATE_NS))
    if delays is None:
        return _NO_LAG
    gaps = delays.arrivals[: len(timeline.long_gaps)]
    phases = [delay / 1e9 for delay in delays.phases]
    descheduled = delays.descheduled
    waited = [wait / 1e9 for wait in delays.waited] if descheduled else ()
    return LoopLag(phases, gaps, descheduled / 1e9, waited, delays.exemplar)
