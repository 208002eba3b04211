"""Spans into calls, and calls into a bounded sliding window per service and provider host.

Spans reach the service in the order their batches leave the programs: a call's phase spans,
its attempts and its parent in one batch or in several. :class:`Assembler` holds a trace's spans
until no new one came for ``settle`` seconds (or it is ``max_age`` old), then reads them into
calls as ``explain`` reads a file. Its memory is bounded: past ``max_spans`` pending spans, the
oldest traces are read at once.

:class:`Windows` keeps, for each (service, host), the newest calls that ended within ``span``
seconds, at most ``per_key`` of them, and at most ``max_keys`` keys (the one idle longest goes
first). The newest calls, not a random sample of them: the pool's and the concurrency rules read
how calls overlapped, which a sample thins out; a stretch of time kept whole keeps them. At high
traffic the window covers less time, and the rates (:mod:`~llm_latency.advise.advisor`) are
taken over what it covers.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from llm_latency.diagnosis.records import Call, SpanRecord, calls_from_spans

#: A key: the program's ``service.name`` and the provider's host.
Key = tuple[str, str]
#: The service of spans whose resource names none.
UNKNOWN_SERVICE: Final = "unknown_service"


@dataclass
class _Trace:
    spans: list[SpanRecord] = field(default_factory=list)
    first: float = 0.0
    last: float = 0.0


class Assembler:
    """Spans of unfinished traces, read into calls once their trace settles."""

    def __init__(self, settle: float, max_age: float, max_spans: int) -> None:
        self.settle = settle
        self.max_age = max_age
        self.max_spans = max_spans
        self._traces: OrderedDict[str, _Trace] = OrderedDict()  # by first arrival
        self._pending = 0

    @property
    def pending(self) -> int:
        """Spans waiting for their trace to settle."""
        return self._pending

    def add(self, spans: Iterable[SpanRecord], now: float) -> list[Call]:
        """Holds ``spans`` (arrived at monotonic time ``now``); returns the calls of the oldest
        traces read early to stay within ``max_spans``."""
        for span in spans:
            trace = self._traces.get(span.trace_id)
            if trace is None:
                trace = self._traces[span.trace_id] = _Trace(first=now)
            trace.spans.append(span)
            trace.last = now
            self._pending += 1
        early: list[SpanRecord] = []
        while self._pending > self.max_spans and self._traces:
            early += self._pop(next(iter(self._traces)))
        return calls_from_spans(early) if early else []

    def settled(self, now: float, everything: bool = False) -> list[Call]:
        """The calls of the traces that settled by ``now`` (all of them: ``everything``)."""
        done = [
            trace_id
            for trace_id, trace in self._traces.items()
            if everything or now - trace.last >= self.settle or now - trace.first >= self.max_age
        ]
        spans: list[SpanRecord] = []
        for trace_id in done:
            spans += self._pop(trace_id)
        return calls_from_spans(spans) if spans else []

    def _pop(self, trace_id: str) -> list[SpanRecord]:
        spans = self._traces.pop(trace_id).spans
        self._pending -= len(spans)
        return spans


def key_of(call: Call) -> Key:
    """The window a call belongs to: its first attempt's service and host."""
    first = call.attempts[0]
    return (first.service or UNKNOWN_SERVICE, first.host or "")


def end_ns(call: Call) -> int:
    """When the call ended (ns since the epoch)."""
    return call.start_ns + int(call.duration * 1e9)


class Windows:
    """The newest calls per (service, host): ended within ``span`` s, ``per_key`` at most, in
    ``max_keys`` keys at most."""

    def __init__(self, span: float, per_key: int, max_keys: int) -> None:
        self.span = span
        self.per_key = per_key
        self.max_keys = max_keys
        self._calls: OrderedDict[Key, deque[Call]] = OrderedDict()  # least recently fed first
        #: Calls let go before their time: pushed out by newer ones, or with their key.
        self.dropped = 0

    def add(self, calls: Iterable[Call]) -> None:
        """Adds finished ``calls`` (the ones without attempts are not LLM calls: ignored)."""
        for call in calls:
            if not call.attempts:
                continue
            key = key_of(call)
            window = self._calls.get(key)
            if window is None:
                window = self._calls[key] = deque(maxlen=self.per_key)
                while len(self._calls) > self.max_keys:
                    _, gone = self._calls.popitem(last=False)
                    self.dropped += len(gone)
            else:
                self._calls.move_to_end(key)
            if len(window) == self.per_key:
                self.dropped += 1
            window.append(call)

    def expire(self, now_ns: int) -> None:
        """Lets go of the calls that ended more than ``span`` s before ``now_ns``, and of the
        keys left with none."""
        oldest = now_ns - int(self.span * 1e9)
        for key in list(self._calls):
            window = self._calls[key]
            kept = [call for call in window if end_ns(call) >= oldest]
            if len(kept) != len(window):
                window.clear()
                window.extend(kept)
            if not window:
                del self._calls[key]

    def snapshot(self) -> dict[Key, list[Call]]:
        """Each key's calls, as lists the caller may read while calls keep coming."""
        return {key: list(window) for key, window in self._calls.items()}

    def __len__(self) -> int:
        return sum(len(window) for window in self._calls.values())
