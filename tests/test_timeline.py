"""The Timeline's bookkeeping rules that no client exercises on a good day: a phase's recorded
end never comes before its start (clocks read by different hooks, an attempt closed at an
earlier instant than a phase began)."""

from __future__ import annotations

import time

from llm_latency.timeline import SEND, WAIT, Timeline


def test_a_phase_never_ends_before_it_began() -> None:
    attempt = Timeline("POST", "http://127.0.0.1/v1/chat/completions")
    now = time.perf_counter_ns()
    attempt.begin(SEND, at=now)
    attempt.begin(WAIT, at=now + 2_000_000)  # the wait began 2 ms later...
    assert attempt.close(at=now + 1_000_000)  # ...than the instant the attempt was closed at
    assert attempt.bounds_of(WAIT) == (now + 2_000_000, now + 2_000_000)
    assert attempt.duration_of(WAIT) == 0.0


def test_an_open_phase_ends_with_the_attempt() -> None:
    attempt = Timeline("POST", "http://127.0.0.1/v1/chat/completions")
    now = time.perf_counter_ns()
    attempt.begin(WAIT, at=now)
    attempt.close(at=now + 5_000_000)
    assert attempt.duration_of(WAIT) == 0.005
    assert attempt.current_phase is None
