"""The Timeline's bookkeeping rules that no client exercises on a good day: a phase's recorded
end never comes before its start (clocks read by different hooks, an attempt closed at an
earlier instant than a phase began), and no phase reaches past the attempt's end (a hook of the
program's thread still running as another thread ends the attempt: uninstrument)."""

from __future__ import annotations

import itertools
import random
import time
from unittest.mock import patch

from llm_latency.timeline import (
    CONNECT,
    DNS,
    LONG_GAPS_KEPT,
    PHASE_NAMES,
    QUEUE,
    RECEIVE,
    SEND,
    TLS,
    WAIT,
    Timeline,
)


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


def test_the_longest_gaps_between_chunks_are_kept() -> None:
    """Every gap between body chunks is a candidate stall of the program's loop: the longest
    LONG_GAPS_KEPT are kept, with their instants, and the raw longest gap beside them."""
    attempt = Timeline("POST", "http://127.0.0.1/v1/chat/completions")
    gaps_ms = [5, 40, 3, 300, 7, 20, 9, 11, 2, 13, 8, 50, 1]
    clock = time.perf_counter_ns()
    arrivals = [clock]
    for gap in gaps_ms:
        arrivals.append(arrivals[-1] + gap * 1_000_000)
    for at in arrivals:
        chunk_at(attempt, at)
    assert all(length == end - start for length, start, end in attempt.long_gaps)
    kept = sorted(length // 1_000_000 for length, _, _ in attempt.long_gaps)
    assert kept == sorted(gaps_ms, reverse=True)[:LONG_GAPS_KEPT][::-1]
    assert attempt.max_gap_ns == 300_000_000
    assert attempt.gap_floor_ns == min(kept) * 1_000_000
    starts = {start for _, start, _ in attempt.long_gaps}
    assert starts <= set(arrivals)  # each gap is between two arrivals


def chunk_at(attempt: Timeline, at: int, data: bytes = b"data: {}\n\n") -> None:
    """``attempt.chunk`` as if it ran at ``at`` (perf_counter_ns)."""
    with patch("llm_latency.timeline.clock_ns", return_value=at):
        attempt.chunk(data)


CONTROL = b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
TOKEN = b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n'


def test_the_stream_s_longest_gap_from_its_first_token() -> None:
    """Whatever the gaps, and wherever the first token comes (or none does): the longest gap
    from the first token on (none before it counts), the longest of all, and the
    LONG_GAPS_KEPT longest kept, as read from every gap. (The first token's gaps are watched
    through the same threshold as the longest ones: a gap under both is neither.)"""
    rng = random.Random(5)
    for _ in range(250):
        count = rng.randrange(1, 60)
        token_at = rng.randrange(count + 1)  # == count: no token
        at = time.perf_counter_ns()
        arrivals = []
        for _ in range(count):
            at += rng.choice([rng.randrange(1, 30), rng.randrange(1, 2000)]) * 1_000_000
            arrivals.append(at)
        attempt = Timeline("POST", "http://127.0.0.1/v1/chat/completions")
        attempt.llm_route = True
        attempt.status_code = 200
        attempt.response_body("text/event-stream")
        assert attempt.body is not None
        for index, when in enumerate(arrivals):
            chunk_at(attempt, when, TOKEN if index >= token_at else CONTROL)
        gaps = [(end - start, start) for start, end in itertools.pairwise(arrivals)]
        token = arrivals[token_at] if token_at < count else 0
        assert attempt.body.first_token_ns == token
        from_token = [length for length, start in gaps if token and start >= token]
        assert attempt.token_max_gap_ns == max(from_token, default=0)
        assert attempt.max_gap_ns == max((length for length, _ in gaps), default=0)
        longest = sorted(length for length, _ in gaps)[-LONG_GAPS_KEPT:]
        assert sorted(length for length, _, _ in attempt.long_gaps) == longest


def test_windows_are_the_bounds_of_every_phase_that_happened() -> None:
    """``windows()`` (what the emitter and the loop monitor read) is ``bounds_of`` of each phase
    that happened, in order, whichever way a phase was stamped: begun, resumed, ended without a
    begin, discarded, still open at the end, or stamped after the end."""
    attempt = Timeline("POST", "http://llm.test/v1/chat/completions")
    now = attempt.start_ns

    def every_phase() -> list[tuple[int, int, int]]:
        found = [(phase, attempt.bounds_of(phase)) for phase in range(len(PHASE_NAMES))]
        return [(phase, *bounds) for phase, bounds in found if bounds is not None]

    attempt.begin(QUEUE, at=now + 1)
    attempt.end_phase(QUEUE, at=now + 2)
    attempt.begin(DNS, at=now + 2)
    attempt.discard(DNS)
    attempt.end_phase(CONNECT, at=now + 5)  # never begun: starts where it ends
    attempt.resume(TLS)
    attempt.begin(SEND, at=now + 7)
    assert attempt.windows() == every_phase()
    assert [phase for phase, _, _ in attempt.windows()] == [QUEUE, CONNECT, TLS, SEND]
    attempt.close(at=now + 6)  # the send still open, stamped after the end: clipped to it
    attempt.end_phase(WAIT, at=now + 9)
    assert attempt.windows() == every_phase()
    assert attempt.windows()[-1] == (WAIT, now + 6, now + 6)
