"""The findings service's memory: spans held until their trace settles, then calls in a window
per (service, host) that keeps the newest calls, a bounded number of them in a bounded number
of windows, and lets the old ones go."""

from __future__ import annotations

from llm_latency import semconv
from llm_latency.advise.advisor import Advisor, Settings, complete
from llm_latency.advise.windows import Assembler, Windows
from llm_latency.diagnosis.records import Attempt, Call, Phase, SpanRecord

SECOND = 1_000_000_000


def call(
    start: float, service: str = "app", host: str = "api.example", seconds: float = 1.0
) -> Call:
    attempt = Attempt(
        start_ns=int(start * SECOND),
        duration=seconds,
        phases=(Phase("wait", 0.0, seconds),),
        host=host,
        method="POST",
        status=200,
        service=service,
    )
    return Call("POST", attempt.start_ns, seconds, [attempt])


def spans(trace: str, start: int) -> tuple[SpanRecord, SpanRecord, SpanRecord]:
    """A program span, its request span and the request's wait phase."""
    parent = SpanRecord(trace, "a" * 16, None, "work", "INTERNAL", start, start + SECOND, {})
    request = SpanRecord(
        trace, "b" * 16, "a" * 16, "POST", "CLIENT", start, start + SECOND // 2,
        {semconv.URL_FULL: "http://api.example/v1", semconv.SERVER_ADDRESS: "api.example",
         semconv.HTTP_RESPONSE_STATUS_CODE: 200},
        scope=semconv.SCOPE_NAME, service="app",
    )  # fmt: skip
    wait = SpanRecord(
        trace, "c" * 16, "b" * 16, "http.wait", "INTERNAL", start, start + SECOND // 4,
        {semconv.PHASE: "wait"}, scope=semconv.SCOPE_NAME, service="app",
    )  # fmt: skip
    return parent, request, wait


def test_a_trace_sent_in_pieces_is_read_once_it_settles() -> None:
    """The phase span in one export, the request and its parent in the next: nothing is read
    before the trace settles, then one call of one attempt with its phase."""
    parent, request, wait = spans("1" * 32, 10 * SECOND)
    assembler = Assembler(settle=5.0, max_age=60.0, max_spans=100)
    assembler.add([wait], now=0.0)
    assembler.add([request, parent], now=3.0)
    assert assembler.settled(now=7.0) == []  # 4 s since its last span
    (read,) = assembler.settled(now=8.0)
    assert read.name == "work" and len(read.attempts) == 1
    assert read.attempts[0].phase("wait") == 0.25
    assert assembler.pending == 0


def test_pending_spans_are_bounded() -> None:
    """Past max_spans pending spans, the oldest traces are read at once."""
    assembler = Assembler(settle=5.0, max_age=60.0, max_spans=6)
    early = []
    for number in range(4):
        early += assembler.add(spans(f"{number:032x}", number * SECOND), now=0.0)
    assert assembler.pending <= 6
    assert [c.start_ns for c in early] == [0, SECOND]  # the two oldest traces, whole


def test_a_window_keeps_the_newest_calls_and_a_bounded_number_of_keys() -> None:
    windows = Windows(span=300.0, per_key=3, max_keys=2)
    windows.add(call(t) for t in range(5))
    assert [c.start_ns // SECOND for c in windows.snapshot()["app", "api.example"]] == [2, 3, 4]
    windows.add([call(10, host="b.example"), call(11, host="c.example")])
    assert set(windows.snapshot()) == {("app", "b.example"), ("app", "c.example")}
    assert windows.dropped == 2 + 3


def test_old_calls_leave_the_window() -> None:
    windows = Windows(span=60.0, per_key=100, max_keys=10)
    windows.add([call(0), call(45), call(70, host="other.example")])
    windows.expire(now_ns=100 * SECOND)  # calls that ended before 40 s go
    assert {key: len(calls) for key, calls in windows.snapshot().items()} == {
        ("app", "api.example"): 1,
        ("app", "other.example"): 1,
    }
    windows.expire(now_ns=200 * SECOND)
    assert windows.snapshot() == {}


def test_the_advisor_holds_a_bounded_number_of_calls() -> None:
    advisor = Advisor(Settings(window=3600.0, per_key=50, max_keys=4, interval=1.0))
    advisor.add_calls(call(t / 10, host=f"h{t // 1250}.example") for t in range(10_000))
    snapshot = advisor.run_diagnosis(now_ns=1_001 * SECOND)
    assert len(snapshot.windows) == 4
    assert sum(w.calls for w in snapshot.windows) == 4 * 50
    assert snapshot.calls_dropped == 10_000 - 200


def test_only_calls_whose_peers_have_all_arrived_are_diagnosed() -> None:
    """A call that started within the longest call, the spans' delay and the settling time
    before now may have peers still running or on their way: it waits for the next diagnosis."""
    settings = Settings(delay=10.0, settle=5.0)
    calls = [call(0, seconds=3.0), call(1), call(2)]
    assert complete(calls, now_ns=19 * SECOND, settings=settings) == calls[:2]  # horizon 1 s
    assert complete(calls, now_ns=20 * SECOND, settings=settings) == calls
