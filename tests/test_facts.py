"""The facts of a finished attempt, read from its Timeline alone (no OpenTelemetry): the
server's time, the network overhead, the loop lag the program is charged, the stream's facts,
the error type, and the wait a server asked for."""

from __future__ import annotations

import random
from decimal import Decimal

from llm_latency.facts import AttemptFacts, LoopLag, provider_max_gap, read_facts, to_ns
from llm_latency.sse import SSECounter
from llm_latency.timeline import CONNECT, PHASE_NAMES, RECEIVE, SEND, WAIT, Timeline

MS = 1_000_000
WANTED = frozenset({"openai-processing-ms", "retry-after-ms", "x-request-id"})


def lags(**by_phase: float) -> LoopLag:
    """Per-phase lags (s) as the emitter hands them over: indexed like ``PHASE_NAMES``."""
    return LoopLag([by_phase.get(name, 0.0) for name in PHASE_NAMES])


def attempt(processing_ms: str | None = "250", status: int = 200) -> Timeline:
    """Sent at 0-20 ms, first byte at 320 ms, last byte at 400 ms."""
    timeline = Timeline("POST", "http://api.llm.test/v1/chat/completions")
    t0 = timeline.start_ns
    timeline.begin(SEND, at=t0)
    timeline.begin(WAIT, at=t0 + 20 * MS)
    timeline.end_phase(WAIT, at=t0 + 320 * MS)
    timeline.begin(RECEIVE, at=t0 + 320 * MS)
    timeline.status_code = status
    timeline.response_headers = [(b"X-Request-Id", b"req_1"), (b"Content-Type", b"json")]
    if processing_ms is not None:
        timeline.response_headers.append((b"openai-processing-ms", processing_ms.encode()))
    timeline.close(at=t0 + 400 * MS)
    return timeline


def test_the_overhead_is_the_window_less_the_servers_time() -> None:
    facts = read_facts(attempt(), None, WANTED)
    assert facts.headers == {"x-request-id": ["req_1"], "openai-processing-ms": ["250"]}
    assert facts.server_processing == 0.25
    # From the start of the send (0 ms) to the first byte (320 ms), less 250 ms.
    assert facts.network_overhead is not None and abs(facts.network_overhead - 0.07) < 1e-9
    assert facts.event_loop_lag is None and facts.error_type is None


def test_the_lag_charged_to_the_wait_never_takes_the_servers_time() -> None:
    """The loop was busy for 200 ms of the wait and 30 ms of the receive; the server says it
    spent 250 of the 320 ms window, so at most 70 ms of the wait can be the program's."""
    facts = read_facts(attempt(), lags(wait=0.2, receive=0.03), WANTED)
    assert facts.event_loop_lag is not None and abs(facts.event_loop_lag - 0.1) < 1e-9
    assert facts.network_overhead is not None and abs(facts.network_overhead) < 1e-9
    # The phases carry what the attempt is charged: the wait its capped share.
    assert facts.phase_lags is not None
    assert abs(facts.phase_lags[WAIT] - 0.07) < 1e-9 and facts.phase_lags[RECEIVE] == 0.03
    assert abs(sum(facts.phase_lags) - facts.event_loop_lag) < 1e-12


def test_without_the_servers_time_the_lag_is_all_charged() -> None:
    facts = read_facts(attempt(processing_ms=None), lags(wait=0.2, receive=0.03), WANTED)
    assert facts.event_loop_lag is not None and abs(facts.event_loop_lag - 0.23) < 1e-9
    assert facts.server_processing is None and facts.network_overhead is None


def test_the_lag_of_every_phase_is_the_attempts_but_the_overhead_drops_only_the_windows() -> None:
    """A stall while connecting (120 ms) and sending (10 ms) is the attempt's lag; the network
    overhead, a share of the send-to-first-byte window, takes out only the send's."""
    timeline = attempt()
    timeline.begin(CONNECT, at=timeline.start_ns - 150 * MS)
    timeline.end_phase(CONNECT, at=timeline.start_ns)
    facts = read_facts(timeline, lags(connect=0.12, send=0.01), WANTED)
    assert facts.event_loop_lag is not None and abs(facts.event_loop_lag - 0.13) < 1e-9
    assert facts.phase_lags is not None and facts.phase_lags[CONNECT] == 0.12
    assert facts.phase_lags[SEND] == 0.01
    assert facts.network_overhead is not None and abs(facts.network_overhead - 0.06) < 1e-9


def test_a_failed_status_and_the_wait_it_asks_for() -> None:
    timeline = attempt(status=429)
    assert timeline.response_headers is not None
    timeline.response_headers = [*timeline.response_headers, (b"retry-after-ms", b"1500")]
    facts = read_facts(timeline, None, WANTED)
    assert (facts.status, facts.error_type, facts.retry_after) == (429, "429", 1.5)


def test_an_exception_names_the_phase_it_interrupted() -> None:
    timeline = Timeline("POST", "http://api.llm.test/v1/chat/completions")
    timeline.begin(WAIT)
    timeline.fail(TimeoutError("read timed out"))
    timeline.close()
    facts = read_facts(timeline, None, WANTED)
    assert (facts.error_type, facts.failed_phase, facts.status) == ("TimeoutError", "wait", None)


def test_a_streams_facts() -> None:
    timeline = Timeline("POST", "http://api.llm.test/v1/chat/completions")
    timeline.stream = SSECounter()
    timeline.begin(RECEIVE)
    for _ in range(3):
        timeline.chunk(b"data: {}\n\n")
    timeline.close()
    facts = read_facts(timeline, None, WANTED)
    assert isinstance(facts, AttemptFacts)
    assert facts.stream_events == 3
    assert facts.time_to_first_chunk is not None and facts.time_to_first_chunk >= 0
    assert facts.stream_max_gap is not None and facts.stream_max_gap >= 0


def test_the_streams_longest_gap_leaves_out_the_loops_lag() -> None:
    """Chunks 20 ms apart but for a 320 ms gap that the loop's stall made (300 ms of it): the
    provider's longest pause is the next gap, 40 ms, not the stall."""
    timeline = attempt()
    timeline.long_gaps = [
        (320 * MS, 0, 320 * MS),
        (40 * MS, 400 * MS, 440 * MS),
        (20 * MS, 500 * MS, 520 * MS),
    ]
    timeline.max_gap_ns = 320 * MS
    assert provider_max_gap(timeline, [300 * MS, 0, 0]) == 40 * MS
    assert provider_max_gap(timeline, [0, 0, 0]) == 320 * MS
    # When every kept gap was the loop's, the gaps not kept are no longer than the floor.
    timeline.gap_floor_ns = 20 * MS
    assert provider_max_gap(timeline, [310 * MS, 30 * MS, 15 * MS]) == 20 * MS


def test_the_wait_before_the_first_token_is_no_gap_of_the_stream() -> None:
    """Control events at once, 1.5 s of the provider's queue, then the tokens 20 ms apart
    with one 40 ms pause: the longest gap is the pause, with the loop's lag taken off or not;
    the wait before the first token (the gap that ends at it) is no pause of the stream."""
    timeline = attempt()
    timeline.llm_route = True
    timeline.response_body("text/event-stream")
    assert timeline.body is not None
    timeline.body.first_token_ns = 1600 * MS
    timeline.long_gaps = [
        (1500 * MS, 100 * MS, 1600 * MS),  # message_start and ping, then the queue
        (40 * MS, 1700 * MS, 1740 * MS),
        (20 * MS, 1600 * MS, 1620 * MS),
    ]
    timeline.max_gap_ns = 1500 * MS
    timeline.token_max_gap_ns = 40 * MS
    assert provider_max_gap(timeline, [0, 0, 0]) == 40 * MS
    assert provider_max_gap(timeline, [0, 30 * MS, 0]) == 20 * MS
    # A stream whose first token was not seen counts from its first chunk, as before.
    timeline.body.first_token_ns = 0
    assert provider_max_gap(timeline, [0, 0, 0]) == 1500 * MS


def test_the_machines_wait_in_the_window_is_not_network_overhead() -> None:
    """The loop's thread waited 40 ms for a CPU at the end of the wait (another process had
    the core) and the loop was busy 10 ms with the program: of the 70 ms the server does not
    account for, 20 ms are the network's. The machine's wait is in no phase's lag."""
    lag = LoopLag(lags(wait=0.01).phases, descheduled=0.05, waited=lags(wait=0.04).phases)
    facts = read_facts(attempt(), lag, WANTED)
    assert facts.network_overhead is not None and abs(facts.network_overhead - 0.02) < 1e-9
    assert facts.event_loop_lag is not None and abs(facts.event_loop_lag - 0.01) < 1e-9
    assert facts.descheduled == 0.05  # the attempt's whole wait, as measured


def test_the_machines_wait_never_takes_the_servers_time() -> None:
    """A wait for a CPU longer than what the server's 250 ms leave of the 320 ms window: the
    overhead is 0, never negative, and the program keeps its lag (charged first)."""
    lag = LoopLag(lags(wait=0.03).phases, descheduled=0.2, waited=lags(send=0.01, wait=0.19).phases)
    facts = read_facts(attempt(), lag, WANTED)
    assert facts.network_overhead is not None and abs(facts.network_overhead) < 1e-9
    assert facts.event_loop_lag is not None and abs(facts.event_loop_lag - 0.03) < 1e-9


def test_the_machines_wait_outside_the_window_stays_in_the_overhead() -> None:
    """A wait for a CPU that delayed the connect's end, before the window: not the window's."""
    lag = LoopLag(lags().phases, descheduled=0.1, waited=lags(connect=0.1).phases)
    facts = read_facts(attempt(), lag, WANTED)
    assert facts.network_overhead is not None and abs(facts.network_overhead - 0.07) < 1e-9


def test_each_phases_share_of_the_machines_wait_is_what_the_overhead_left_out() -> None:
    """The loop's thread waited for a CPU 50 ms at the end of the send and 40 ms at the end of
    the wait, and 30 ms in the receive; the loop was busy 10 ms with the program in the wait.
    The server's 250 ms leave 70 ms of the 320 ms window: 10 ms are the lag, so 60 ms can be
    the machine's. The wait keeps its 40 ms (the server's time ends in it), the send the 20 ms
    left: the phases' shares are what the overhead left out, and the receive keeps its own."""
    waited = lags(send=0.05, wait=0.04, receive=0.03).phases
    lag = LoopLag(lags(wait=0.01).phases, descheduled=0.12, waited=waited)
    facts = read_facts(attempt(), lag, WANTED)
    assert facts.phase_waits is not None and facts.phase_lags is not None
    assert facts.phase_waits[WAIT] == 0.04 and facts.phase_waits[SEND] == 0.02
    assert facts.phase_waits[RECEIVE] == 0.03
    assert facts.network_overhead is not None and abs(facts.network_overhead) < 1e-9
    left_out = sum(facts.phase_lags[p] + facts.phase_waits[p] for p in (SEND, WAIT))
    assert abs(left_out - (0.32 - 0.25)) < 1e-9
    assert facts.descheduled == 0.12  # the attempt's whole wait, as measured
    # A wait for a CPU longer than the window leaves: the wait's share is cut to what is left.
    lag = LoopLag(lags(wait=0.03).phases, descheduled=0.2, waited=lags(send=0.01, wait=0.19).phases)
    facts = read_facts(attempt(), lag, WANTED)
    assert facts.phase_waits is not None
    assert facts.phase_waits[WAIT] == 0.04 and facts.phase_waits[SEND] == 0.0
    # Without the server's time nothing is clipped; without a wait for a CPU there is none.
    lag = LoopLag(lags().phases, descheduled=0.12, waited=waited)
    facts = read_facts(attempt(processing_ms=None), lag, WANTED)
    assert facts.phase_waits == list(waited)
    assert read_facts(attempt(), lags(wait=0.01), WANTED).phase_waits is None
    assert read_facts(attempt(), None, WANTED).phase_waits is None


def test_computed_seconds_are_whole_nanoseconds() -> None:
    """Sums and differences of seconds read from ns clocks come out as the decimal of whole ns,
    with no float noise in their text (0.016716636, never 0.016716636000000007)."""
    rng = random.Random(7)
    for _ in range(20_000):
        a, b, c = (rng.randrange(10**12) for _ in range(3))
        seconds = to_ns(a / 1e9 - b / 1e9 + c / 1e9)
        assert seconds == (a - b + c) / 1e9
        assert Decimal(repr(seconds)).as_tuple().exponent >= -9  # type: ignore[operator]
    assert repr(to_ns(0.016716636000000007)) == "0.016716636"


def test_clipped_lags_and_overhead_show_no_noise() -> None:
    """The lag clipped to what the server's time leaves of the window, its sum and the
    overhead: each the decimal of whole ns."""
    facts = read_facts(attempt("250"), lags(send=0.0123456789, wait=0.0987654321), WANTED)
    values = [*(facts.phase_lags or ()), facts.event_loop_lag, facts.network_overhead]
    assert any(values)
    for value in values:
        assert value is not None
        assert Decimal(repr(value)).as_tuple().exponent >= -9  # type: ignore[operator]
