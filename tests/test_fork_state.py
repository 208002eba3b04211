"""A forked child starts with none of its parent's in-process state: the event loop's lag
monitors (the tallies: tests/test_tallies.py; the SDK's metric points and the export health of
an SDK llm-latency set up: the preloaded gunicorn test in tests/test_stopping.py). And the
lag monitors' lookup: one monitor per loop."""

from __future__ import annotations

import asyncio
import os

from llm_latency import event_loop


async def test_a_forked_child_starts_without_the_parents_loop_monitors() -> None:
    monitor = event_loop.monitor_of_running_loop()
    assert monitor is not None
    monitor.attempt_started()  # in flight at the fork: its timer is due on this loop
    await asyncio.sleep(0.05)
    pid = os.fork()
    if pid == 0:  # the child: the parent's monitor neither kept nor ticking
        code = 1
        try:
            if event_loop._monitors or event_loop._last is not None:
                code = 3  # the parent's monitors came along
            elif monitor._handle is not None or not monitor._stopped:
                code = 4  # its timer would keep ticking on the child's copy of the loop
            else:
                code = 0
        finally:
            os._exit(code)
    _, status = await asyncio.to_thread(os.waitpid, pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert event_loop.monitor_of_running_loop() is monitor  # the parent keeps its own
    monitor.phase_delays((), 0)  # its attempt ends


def test_each_loop_has_a_monitor_of_its_own() -> None:
    """One monitor per loop, found again for the same loop, whichever loop asked last."""

    async def monitors() -> tuple[object, object]:
        return event_loop.monitor_of_running_loop(), event_loop.monitor_of_running_loop()

    first, again = asyncio.run(monitors())
    second, _ = asyncio.run(monitors())
    assert first is not None and first is again
    assert second is not None and second is not first
    # Two loops alive at once, asking in turn.
    loops = [asyncio.new_event_loop() for _ in range(2)]
    try:
        found = [loop.run_until_complete(monitors())[0] for loop in loops + loops]
    finally:
        for loop in loops:
            loop.close()
    assert found[0] is found[2] and found[1] is found[3] and found[0] is not found[1]
