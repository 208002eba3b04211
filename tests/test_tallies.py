"""The counters' in-process tallies survive a fork: a worker forked while another thread of
its parent held a tally's lock can still count, and starts from zero (the parent reports what
it counted before the fork)."""

from __future__ import annotations

import os
import threading

import pytest
from opentelemetry.metrics import CallbackOptions

from llm_latency.metrics import _FreshValues, _Tallies

KEY = (("server.address", "api.llm.test"),)


@pytest.mark.parametrize("kind", [_Tallies, _FreshValues])
def test_a_forked_child_counts_from_zero_with_a_free_lock(kind: type[_Tallies]) -> None:
    tallies = kind()
    if isinstance(tallies, _FreshValues):
        tallies.set_fresh(KEY, 7, 60)
    else:
        tallies.add(KEY)
    held, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with tallies._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    held.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: one thread, and the lock was held at the fork
        code = 1
        try:
            counted = threading.Thread(target=tallies.add, args=(KEY, 2))
            counted.start()
            counted.join(5)
            if counted.is_alive():
                code = 3  # deadlocked on the parent's lock
            elif [(o.value, o.attributes) for o in tallies.observe(CallbackOptions())] == [
                (2, dict(KEY))
            ]:
                code = 0
            else:
                code = 4  # the parent's values came along
        finally:
            os._exit(code)
    release.set()
    holder.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent still has its own value.
    assert [o.value for o in tallies.observe(CallbackOptions())] == [
        7 if kind is _FreshValues else 1
    ]
