"""The event-loop lag monitors: one per running loop, made at its first attempt, forgotten with
the loop (:class:`~llm_latency.lag_monitor.LoopLagMonitor` measures the lag).

A monitor lives as long as its loop and holds nothing of it: the loop holds the monitor's timer
(the monitor keeps a weak reference to it), the ticks run in an empty context of their own (a
timer copies the current one by default, with the span of the attempt that scheduled it), and
the CPU-wait clock read is the running thread's (:func:`llm_latency.cpu_wait.clock_of_this_thread`).
A closed or dropped loop leaves nothing behind: a worker that runs each job in its own loop
keeps no loop, context, span or file of its jobs. An attempt still in flight when its loop
closed or went can never end: :data:`closed_in_flight` hands its monitor to the emitter, which
forgets it.
"""

from __future__ import annotations

import asyncio
import weakref

from llm_latency.lag_monitor import LoopLagMonitor
from llm_latency.live_state import register

#: The monitor of each loop, by a weak reference to the loop (the monitor's own): a monitor
#: holds nothing that holds its loop (its timer is the loop's, held weakly), so the entry ends
#: with the loop, and the monitor with it.
_monitors: dict[weakref.ref[asyncio.AbstractEventLoop], LoopLagMonitor] = {}
#: The monitor found last, with a weak reference to its loop: a program runs its attempts on
#: one loop, and a weak dictionary's lookup makes a weak reference each time.
_last: tuple[weakref.ref[asyncio.AbstractEventLoop], LoopLagMonitor] | None = None
#: Monitors of loops that closed, or went, with attempts still in flight: nothing can end those
#: attempts now. The emitter forgets them at its next attempt on a loop (usually empty: one
#: truth test per attempt).
closed_in_flight: list[LoopLagMonitor] = []


def monitor_of_running_loop() -> LoopLagMonitor | None:
    """The monitor of the loop running in this thread (made at its first attempt), if any."""
    global _last
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    last = _last
    if last is not None and last[0]() is loop:
        return last[1]
    monitor = _monitors.get(weakref.ref(loop))
    if monitor is None:
        _forget_closed()  # a new loop: a worker with a loop per job makes one per job
        monitor = LoopLagMonitor(loop, _forget)
        _monitors[monitor.loop] = monitor
    _last = (monitor.loop, monitor)
    return monitor


def _forget_closed() -> None:
    """Forget the monitors of loops closed since (a closed loop never runs again, whoever still
    holds it)."""
    for ref in list(_monitors):
        loop = ref()
        if loop is not None and loop.is_closed():
            _forget(ref)


def _forget(ref: weakref.ref[asyncio.AbstractEventLoop]) -> None:
    """The loop of ``ref`` closed or went: its monitor is forgotten, and its attempts still in
    flight are handed to the emitter. Also the weak reference's callback: runs in any thread,
    in the middle of anything (a collection), so it only takes out and appends."""
    global _last
    monitor = _monitors.pop(ref, None)
    last = _last
    if last is not None and last[0] is ref:
        _last = None
    if monitor is not None and monitor.in_flight > 0:
        closed_in_flight.append(monitor)


def stop_all() -> None:
    """Stop every monitor (the plugin is off): their timers are not rescheduled."""
    global _last
    _last = None
    for monitor in list(_monitors.values()):
        monitor.stop()
    _monitors.clear()
    closed_in_flight.clear()


register("loop_monitors", lambda: len(_monitors))
