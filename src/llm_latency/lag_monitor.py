"""Event-loop lag: how long an asyncio loop, busy with other work, delayed what an attempt
waited for, so that a program's own stall is not blamed on the provider or the network.

A response that arrived on time waits in the socket buffer while the loop runs other code (CPU
work between awaits, parsing other responses); the attempt's ``http.wait`` or ``http.receive``
then grows by that time. The same holds in every phase an asyncio attempt waits through: a DNS
answer, a TCP connect, a TLS handshake message or a pooled connection given back while the loop
is busy is seen only when the loop runs again, and that phase (the one that was in progress, so
the one whose end the stall delayed) grows by it. One :class:`LoopLagMonitor` per running loop
measures it the cheap way: while at least one attempt is in flight on the loop, a timer is due
every ``INTERVAL_NS``; when it runs late, the loop was busy from the moment it was due until it
ran. Each time the loop runs, it polls its sockets first, so a phase that ended right after a
busy stretch was delayed by at most that stretch: that is the lag charged to the phase. The
monitors are kept per loop, and forgotten with it, by :mod:`llm_latency.event_loop`.

Phase boundaries are taken by code running on the loop, so none falls inside a stall: a stall
that starts in one phase delays that phase's end, and the next phase starts after it. The
charge of a phase is clipped to the phase, so the charges of an attempt's phases never overlap
and their sum, the attempt's lag, is at most the attempt's duration.

What it can say, and what it cannot:

- A busy stretch is seen from the first tick it delays: its first part, up to one interval
  (10 ms), is not counted.
- When what the phase waited for arrived in the middle of the busy stretch, the stretch's part
  before the arrival counts too (the arrival time cannot be known from user space): the lag is
  an upper bound of the delay, and ``phase - lag`` a lower bound of the provider's and the
  network's share, off by at most that one stretch.
- A stall that ended before what the phase waited for arrived did not delay it: a phase that
  ends later than ``SETTLE_NS`` after the loop was free again is charged nothing for it.
- A stream's body arrives in chunks, and each chunk's arrival is an end the loop may have
  delayed, like a phase's: the stream's longest gaps between two chunks (and the wait for its
  first chunk, from ``LATE_NS`` on) are charged by the same rule, and the receive phase
  carries the union of those charges and its own. A stall in the middle of a stream is the
  program's lag, and the stream's longest gap (``llm_latency.stream.max_gap``) leaves it out.
- A request queued for a pooled connection (or an HTTP/2 stream) waits for another attempt on
  the same loop to give one back: a stall that delayed that attempt's end delayed the queued
  one's turn by as much, even when the stall ended long before the turn came. The queue phase
  is charged the lag of the attempt that ended last before its turn came (clipped to the queue
  phase), or the stretch its end came after, whichever is more.
- A loop that ran late because the machine had no CPU for it (other processes, a container's
  CPU limit) was not busy with the program's code: each late tick reads how long the loop's
  thread waited on the kernel's run queue since the tick was scheduled
  (:mod:`llm_latency.cpu_wait`), and that share of the stretch is the machine's. It is in no
  phase's lag; each phase keeps its own machine's share apart (``Delays.waited``, on its phase
  span: the network overhead leaves out the send's and the wait's; the receive phase's covers
  its stream's arrival windows too, as its lag does), and the attempt counts the whole of it
  as ``descheduled``. A process stopped by a signal is not waiting for a CPU: that stays the
  program's lag.
- Sync clients (requests, sync httpx) in threads have no loop to watch: a thread that waits for
  the GIL held by other threads is delayed the same way, and that is not measured.
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from llm_latency.clock import clock_ns
from llm_latency.cpu_wait import clock_of_this_thread
from llm_latency.timeline import QUEUE, RECEIVE

#: How often a loop with attempts in flight is checked (ns): the resolution of the lag.
INTERVAL_NS = 10_000_000
#: A tick later than this (ns) counts: below it is the loop's ordinary scheduling jitter.
LATE_NS = 1_000_000
#: A phase that ends this soon (ns) after a busy stretch was delayed by it: the loop runs the
#: callbacks of the data that arrived during the stretch, then wakes the task that waited.
SETTLE_NS = 20_000_000
#: A late stretch that ends this close (ns) to the next one's start is contiguous with it: the
#: next tick was scheduled when it ended.
_CONTIGUOUS_NS = INTERVAL_NS + LATE_NS
#: Busy stretches kept per loop: at most one per interval, so about 160 s of continuous lag.
KEPT = 16_384
#: Ended attempts that were delayed, kept per loop for the queued attempts whose turn their
#: end gave: (end, lag) in ns.
ENDED_KEPT = 256


#: A stretch the loop ran late: (start, end) in ``perf_counter_ns``, and the share of it (0 to
#: 1) that the loop's thread waited for a CPU.
Stretch = tuple[int, int, float]


class Delays(NamedTuple):
    """How long (ns) a busy loop delayed an attempt: per phase, and per arrival window; and how
    long its thread waited for a CPU meanwhile (the machine's share, in no phase's delay): in
    all, and the part of it that delayed each phase's end (``waited``, indexed like
    ``phases``, the receive phase's with its arrival windows'; empty when none did).
    ``exemplar``: whether this attempt is the first charged in the late stretch it ended in
    or after, the one whose lag record carries the trace exemplar (a histogram keeps one
    exemplar per bucket and export: at saturation every attempt lags, and one offer per
    stretch is enough)."""

    phases: list[int]
    arrivals: list[int]
    descheduled: int = 0
    waited: Sequence[int] = ()
    exemplar: bool = True


class LoopLagMonitor:
    """Measures when one event loop was busy, while attempts are in flight on it. ``gone`` is
    called with :attr:`loop` when the loop goes (the registry of :mod:`llm_latency.event_loop`
    forgets the monitor then)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        gone: Callable[[weakref.ref[asyncio.AbstractEventLoop]], None] | None = None,
    ) -> None:
        #: A weak reference to the loop watched (its monitor is forgotten when the loop goes).
        self.loop = weakref.ref(loop, gone)
        self._in_flight = 0
        self._due_ns = 0
        #: Whether a tick is due; the tick's handle, held weakly: the loop holds it (and, by
        #: its callback, this monitor), never the other way round.
        self._ticking = False
        self._handle: weakref.ref[asyncio.TimerHandle] | None = None
        #: The context the ticks run in: an empty one of their own. A timer copies the current
        #: context by default, with the span of the attempt that scheduled it.
        self._context = contextvars.Context()
        self._stopped = False
        #: Each stretch the loop ran late, oldest first.
        self.busy: deque[Stretch] = deque(maxlen=KEPT)
        #: (end, lag) in ``perf_counter_ns`` of each recent attempt the busy loop delayed.
        self.delayed_ends: deque[tuple[int, int]] = deque(maxlen=ENDED_KEPT)
        #: When the current tick was scheduled, the run-queue wait then of the thread that ran
        #: the loop, and which thread's clock that was (its serial).
        self._scheduled_ns = 0
        self._waited_ns = 0
        self._waited_on = -1
        self._pending_share: tuple[int, float] | None = None  # (due, share) of the late tick
        #: The start of the late stretch whose first charged attempt carried the exemplar.
        self._exemplar_stretch = -1

    @property
    def in_flight(self) -> int:
        """The attempts started on this loop and not ended yet."""
        return self._in_flight

    def attempt_started(self) -> None:
        """An attempt starts on this loop (call from the loop's thread)."""
        self._in_flight += 1
        if not self._ticking and not self._stopped:
            self._schedule(clock_ns())

    def phase_delays(
        self,
        windows: Sequence[tuple[int, int, int]],
        phases: int,
        arrivals_of: Callable[[], Sequence[tuple[int, int]]] = tuple,
    ) -> Delays | None:
        """An attempt ends: for each of its ``phases`` (``windows`` holds ``(phase, start,
        end)`` of those that happened, as ``Timeline.windows`` gives them), how long (ns) the
        busy loop delayed the phase's end.
        That is the busy stretch the loop was in when the phase ended (the one in progress now
        included), from its start or the phase's, whichever is later: before it, the loop
        polled its sockets, so what the phase waited for had not arrived. A queue phase may be
        charged more: the lag of the attempt whose end gave it its turn.

        ``arrivals_of()``: windows inside the receive phase that end at a body chunk's arrival
        (a stream's longest gaps, the wait for its first chunk; asked for only when the loop
        was late): each is charged the same way, as a phase of its own, and the receive phase
        is charged the union of its own charge and theirs.

        The share of a late stretch that the loop's thread spent waiting for a CPU
        (:mod:`llm_latency.cpu_wait`) is the machine's: it is in no phase's delay; each
        phase's is kept apart (``waited``; the receive phase's is the machine's share of the
        union of its own charge and its arrival windows', :func:`_machines_share`), and the
        machine's shares of the charged stretches add up to ``descheduled``. None when the
        loop was never late: nothing was delayed (the usual case, kept cheap: no window is
        read)."""
        self._in_flight -= 1
        now = clock_ns()
        late = self._ticking and now - self._due_ns > LATE_NS
        pending = self._pending(now) if late else None
        if pending is None and not self.busy:
            return None
        arrivals = arrivals_of()
        delays = [0] * phases
        waits: list[int] | None = None  # the machine's share of each phase's delay, if any
        arrived: list[int] = []
        machine = 0
        recent: list[Stretch] = []
        try:
            earliest = min([start for _, start, _ in windows]) if windows else now
            recent = self._recent(pending, earliest)
            delay_of = self._delay_of
            queue = receive = None
            for phase, start, end in windows:
                program, waited = delay_of(start, end, recent)
                delays[phase] = program
                if waited:
                    if waits is None:
                        waits = [0] * phases
                    waits[phase] = waited
                    machine += waited
                if phase == RECEIVE:
                    receive = start, end
                elif phase == QUEUE:
                    queue = start, end
            if queue is not None:
                delays[QUEUE] = max(delays[QUEUE], self._handed_on(queue))
            if receive is not None and arrivals:
                charges = [delay_of(start, end, recent) for start, end in arrivals]
                arrived = [program for program, _ in charges]
                charged = [
                    (end - delay, end) for (_, end), delay in zip(arrivals, arrived, strict=True)
                ]
                own = (delays[RECEIVE], 0 if waits is None else waits[RECEIVE])
                charged.append((receive[1] - own[0], receive[1]))
                delays[RECEIVE] = _covered(charged, receive)
                if own[1] or any(waited for _, waited in charges):
                    if waits is None:
                        waits = [0] * phases
                    waits[RECEIVE] = _machines_share(
                        [*arrivals, receive], [*charges, own], receive, delays[RECEIVE]
                    )
                    # The receive's share replaces its own charge's in the whole: a stretch
                    # charged to the phase's end and to the stream's last gap counts once.
                    machine += waits[RECEIVE] - own[1]
        except RuntimeError:  # ended from another thread while the loop recorded one
            pass  # what was charged before stays, the rest is 0
        lag = sum(delays)
        exemplar = False
        if lag:
            self.delayed_ends.append((now, lag))
            newest = recent[0][0] if recent else 0
            exemplar = newest != self._exemplar_stretch
            self._exemplar_stretch = newest
        return Delays(delays, arrived, machine, () if waits is None else waits, exemplar)

    def _recent(self, pending: Stretch | None, earliest: int) -> list[Stretch]:
        """The late stretches an attempt whose first phase began at ``earliest`` may be
        charged, newest first (the one in progress, ``pending``, first): back to the first
        that ended before ``earliest``, where every phase's walk stops (no older one is
        contiguous with a stretch inside the attempt, or it ends before the phase began)."""
        recent = [] if pending is None else [pending]
        for stretch in reversed(self.busy):
            recent.append(stretch)
            if stretch[1] < earliest:
                break
        return recent

    def _handed_on(self, queue: tuple[int, int]) -> int:
        """The lag of the delayed attempt that ended last before ``queue`` did (within
        ``SETTLE_NS``), clipped to the queue phase: its connection, given back that much later,
        gave the queued attempt its turn that much later. Its end is stamped as it gives the
        connection back, a moment before the queued attempt's task resumes (``LATE_NS`` is
        allowed for the order of the two)."""
        start, end = queue
        for ended, delayed in reversed(self.delayed_ends):
            if ended < end - SETTLE_NS:
                break
            if ended <= end + LATE_NS:
                return min(delayed, end - start)
        return 0

    def _delay_of(self, start: int, end: int, recent: Sequence[Stretch]) -> tuple[int, int]:
        """How long the late loop delayed the end of the phase from ``start`` to ``end`` (ns),
        of the stretches ``recent`` (newest first): the late stretch its end came at the end
        of, within the phase, from the stretch's start to the phase's end. Late ticks one
        interval apart are one stretch; the interval between two of them counts as late only
        when the later tick was late by a whole interval or more (the loop was saturated: it
        ran little but the tick). Ticks late by less, on a loop that ran on time in between (a
        loaded machine that takes the process away for a moment), count their lateness only.
        Returns the delay split in two: the program's share (its busy loop) and the machine's
        (the loop's thread waiting for a CPU), each stretch's time split by the share its tick
        measured."""
        late = 0  # ns of the stretches charged, the machine's share included
        machine = 0.0
        newer = 0  # the start of the stretch after, in the same late stretch
        newer_share = 0.0
        saturated = False
        for busy_start, busy_end, share in recent:
            if not newer:
                if busy_start >= end:
                    continue  # after the phase
                if busy_end < end - SETTLE_NS:
                    return 0, 0  # the loop was free before the phase ended
                part = end - (busy_start if busy_start > start else start)
            elif busy_end >= newer - _CONTIGUOUS_NS:
                if busy_end <= start:
                    break  # before the phase
                if saturated:
                    between = newer - (busy_end if busy_end > start else start)
                    if between > 0:
                        late += between
                        if newer_share:
                            machine += between * newer_share
                part = busy_end - (busy_start if busy_start > start else start)
                if part < 0:
                    part = 0
            else:
                break
            late += part
            if share:
                machine += part * share
            if busy_start <= start:
                break
            newer, newer_share = busy_start, share
            saturated = busy_end - busy_start >= INTERVAL_NS
        if not machine:
            return late, 0
        waited = round(machine)
        return max(late - waited, 0), waited

    def stop(self) -> None:
        """No more ticks; the lag of attempts still in flight is what was seen so far."""
        self._stopped = True
        self._ticking = False
        handle = None if self._handle is None else self._handle()
        self._handle = None
        if handle is not None:
            handle.cancel()

    def _schedule(self, now: int) -> None:
        loop = self.loop()
        if loop is None or loop.is_closed():
            self._ticking = False
            self._handle = None
            return
        self._due_ns = now + INTERVAL_NS
        self._scheduled_ns = now
        clock = clock_of_this_thread()
        if clock is not None:
            self._waited_ns = clock.read() or self._waited_ns
            self._waited_on = clock.serial
        handle = loop.call_later(INTERVAL_NS / 1e9, self._tick, context=self._context)
        self._ticking = True
        self._handle = weakref.ref(handle)

    def _stretch(self, due: int, now: int) -> Stretch:
        """The stretch the loop ran late, from ``due`` to ``now``, with the share of the time
        since the tick was scheduled that the loop's thread spent waiting for a CPU."""
        share = 0.0
        clock = clock_of_this_thread()
        # Read only where the loop ran when the tick was scheduled: another thread's count
        # since then says nothing of this loop.
        if clock is not None and clock.serial == self._waited_on:
            waited = clock.read()
            since = now - self._scheduled_ns
            if waited is not None and since > 0:
                share = min(max(waited - self._waited_ns, 0) / since, 1.0)
        return due, now, share

    def _pending(self, now: int) -> Stretch:
        """The stretch the loop is late in now (its tick has not run yet), its CPU-wait share
        read once per stretch: at saturation every attempt ends in one."""
        due = self._due_ns
        cached = self._pending_share
        if cached is not None and cached[0] == due:
            return due, now, cached[1]
        stretch = self._stretch(due, now)
        self._pending_share = (due, stretch[2])
        return stretch

    def _tick(self) -> None:
        now = clock_ns()
        if now - self._due_ns > LATE_NS:
            self.busy.append(self._stretch(self._due_ns, now))
        if self._in_flight > 0 and not self._stopped:
            self._schedule(now)
        else:
            self._ticking = False
            self._handle = None
            self.busy.clear()
            self.delayed_ends.clear()


def _machines_share(
    windows: Sequence[tuple[int, int]],
    charges: Sequence[tuple[int, int]],
    within: tuple[int, int],
    lag: int,
) -> int:
    """The machine's share (ns) of the receive phase ``within``. ``charges`` holds the
    ``(program, machine)`` delay of each of ``windows`` (the stream's arrival windows, then
    the phase itself); ``lag`` is the union of their program's shares, each laid at the end of
    its window.

    The shares cannot be added up: a stall at the phase's end is charged to the stream's last
    gap as well when both end after it (two charges of one stretch). So each charge is laid
    whole at the end of its window, the program's share and the machine's together, and the
    machine's share is what the union of those covers beyond the lag (never below 0: each
    charge laid whole holds its program's share). Being a union, it counts an instant once:
    with the lag it is at most the phase's length. It is at most the machine's shares added
    up (an instant outside the lag lies in some charge outside that charge's program share),
    and exactly that when no two charges overlap. Where one charge's program share lies over
    another's machine share, the time counts as lag."""
    whole = [
        (end - program - waited, end)
        for (_, end), (program, waited) in zip(windows, charges, strict=True)
    ]
    return _covered(whole, within) - lag


def _covered(intervals: Iterable[tuple[int, int]], within: tuple[int, int]) -> int:
    """How long (ns) the union of ``intervals`` covers of the window ``within``."""
    low, high = within
    covered = 0
    reached = low
    for start, end in sorted(intervals):
        start, end = max(start, reached), min(end, high)
        if end > start:
            covered += end - start
            reached = end
    return covered
