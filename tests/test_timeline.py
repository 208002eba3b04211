"""The Timeline's bookkeeping rules that no client exercises on a good day: a phase's recorded
end never comes before its start (clocks read by different hooks, an attempt closed at an
earlier instant than a phase began), and no phase reaches past the attempt's end (a hook of the
program's thread still running as another thread ends the attempt: uninstrument)."""

from __future__ import annotations

import time

from llm_latency.timeline import RECEIVE, SEND, WAIT, Timeline


def test_a_phase_never_ends_before_it_began() -> None:
    attempt = Timeline("POST", "http://127.0.0.1/v1/chat/completions")
    now = time.perf_counter_ns()
    attempt.begin(SEND, at=now)
    attempt.begin(WAIT, at=now + 2_000_000)  # the wait began 2 ms later...
    assert attempt.close(at=now + 1_000_000)  # ...than the instant the attempt was closed at
    assert attempt.bounds_of(WAIT) == (now + 1_000_000, now + 1_000_000)  # at the end, empty
    assert attempt.duration_of(WAIT) == 0.0


def test_an_open_phase_ends_with_the_attempt() -> None:
    attempt = Timeline("POST", "http://127.0.0.1/v1/chat/completions")
    now = time.perf_counter_ns()
    attempt.begin(WAIT, at=now)
    attempt.close(at=now + 5_000_000)
    assert attempt.duration_of(WAIT) == 0.005
    assert attempt.current_phase is None


def test_a_phase_moved_on_after_the_end_stays_inside_the_attempt() -> None:
    """Another thread closes the attempt while the program's thread is between two phases:
    what that thread records afterwards cannot reach past the attempt's end."""
    attempt = Timeline("POST", "http://127.0.0.1/v1/chat/completions")
    now = time.perf_counter_ns()
    attempt.begin(WAIT, at=now)
    assert attempt.close(at=now + 1_000_000)  # uninstrument ends the attempt, mid-wait
    attempt.end_phase(WAIT, at=now + 3_000_000)  # the program's thread: the answer came
    attempt.begin(RECEIVE, at=now + 3_000_000)
    assert attempt.bounds_of(WAIT) == (now, now + 1_000_000)
    assert attempt.bounds_of(RECEIVE) == (now + 1_000_000, now + 1_000_000)
