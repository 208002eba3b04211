"""The client-agnostic record of one HTTP attempt.

An adapter fills a :class:`Timeline` with monotonic timestamps (``time.perf_counter_ns``) and
plain facts while the request runs; the emitter turns it into spans and metrics once it ends.
Nothing here knows about OpenTelemetry naming, and nothing here formats or parses: the hot path
only stores integers and references.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from heapq import heappush, heapreplace
from typing import TYPE_CHECKING, Any, Final

from llm_latency.clock import clock_ns as clock_ns  # importable from here too
from llm_latency.streams import counter_for
from llm_latency.tokens import BodyWatch, body_watch_for

if TYPE_CHECKING:
    from llm_latency.streams import StreamCounter

QUEUE: Final = 0
DNS: Final = 1
CONNECT: Final = 2
#: Through a proxy's ``CONNECT`` tunnel: from the TCP connection to the proxy to its answer.
PROXY: Final = 3
TLS: Final = 4
SEND: Final = 5
WAIT: Final = 6
RECEIVE: Final = 7

#: Phase names, indexed by the constants above, in the order they happen.
PHASE_NAMES: Final[tuple[str, ...]] = (
    "queue",
    "dns",
    "connect",
    "proxy",
    "tls",
    "send",
    "wait",
    "receive",
)

#: The phases of each set of them (a bit per phase), in order.
_PHASES_IN: Final = tuple(
    tuple(phase for phase in range(len(PHASE_NAMES)) if mask >> phase & 1)
    for mask in range(1 << len(PHASE_NAMES))
)

RawHeaders = Sequence[tuple[Any, Any]]

#: The longest gaps between body chunks kept per attempt: each may hold a stall of the
#: program's loop, taken out of the stream's longest gap (``llm_latency.stream.max_gap``).
LONG_GAPS_KEPT: Final = 8

#: A gap between two body chunks: (length, start, end) in ns.
Gap = tuple[int, int, int]


def _clipped(start: int, end: int, closed: int) -> tuple[int, int]:
    """A begun phase's window: an open one (``end`` 0) ends at the attempt's end (``closed``,
    0 while it runs), and none reaches past it."""
    end = end or closed or start
    if closed:
        start, end = min(start, closed), min(end, closed)
    return start, max(end, start)


class Timeline:
    """Phase boundaries and facts of one physical HTTP attempt."""

    __slots__ = (
        "_begun",
        "_bounds",
        "_current",
        "body",
        "chunks",
        "client",
        "closed_by",
        "end_ns",
        "ended",
        "epoch_start_ns",
        "error",
        "failed_phase",
        "first_chunk_ns",
        "gap_floor_ns",
        "gaps",
        "last_chunk_ns",
        "llm_route",
        "long_gaps",
        "max_gap_ns",
        "method",
        "peer_address",
        "protocol_version",
        "proxy_url",
        "resend_count",
        "response_headers",
        "reused",
        "start_ns",
        "status_code",
        "stream",
        "token_max_gap_ns",
        "url",
    )

    def __init__(self, method: str, url: str) -> None:
        self.start_ns = clock_ns()
        self.epoch_start_ns = time.time_ns()
        self.method = method  # as the client sent it
        self.url = url
        # [start, end] per phase, flattened; 0 means "did not happen".
        self._bounds = [0] * (2 * len(PHASE_NAMES))
        self._begun = 0  # a bit per phase whose start was stamped
        self._current = -1
        self.end_ns = 0
        self.ended = False
        self.status_code: int | None = None
        self.protocol_version: str | None = None
        self.response_headers: RawHeaders | None = None
        self.reused: bool | None = None
        #: The client's setting that closes the connection after the attempt (the adapter
        #: names it: ``force_close=True``, ``Connection: close``), when one does.
        self.closed_by: str | None = None
        #: The address the connection went to (the proxy's when proxied), once known.
        self.peer_address: str | None = None
        #: The proxy the attempt went through, as the client was given it (credentials and
        #: all: the emitter redacts it).
        self.proxy_url: str | None = None
        #: What the client says of its own retries (a retry-count header, urllib3's history).
        self.resend_count = 0
        self.error: BaseException | None = None
        self.failed_phase: int | None = None
        self.first_chunk_ns = 0
        self.last_chunk_ns = 0
        self.max_gap_ns = 0
        #: The longest gap that began at or after the first token (``body.first_token_ns``):
        #: the wait before it (the provider's queue, the prompt's prefill, hidden reasoning
        #: after control events) is no pause of the stream.
        self.token_max_gap_ns = 0
        #: The longest intervals between two body chunks, the ones a stall of the program's
        #: event loop may explain (``lag_monitor``): at most LONG_GAPS_KEPT, a heap (the
        #: shortest first; a stream on a saturated loop replaces one every few chunks).
        self.long_gaps: list[Gap] = []
        #: A gap longer than this (ns) is one of the longest so far.
        self.gap_floor_ns = 0
        self.chunks = 0
        #: Each interval between two body chunks (ns), when the emitter asks for them (the
        #: opt-in time-per-output-chunk histogram); None otherwise.
        self.gaps: list[int] | None = None
        self.stream: StreamCounter | None = None  # counts a streamed body's events
        #: The request went to a known LLM route (the emitter says so as the attempt starts):
        #: its body is watched for tokens.
        self.llm_route = False
        #: Watches an LLM answer's body for its first token and usage (``tokens``).
        self.body: BodyWatch | None = None
        self.client = ""  # the client library, named by its adapter (llm_latency.client)

    # -- phases -------------------------------------------------------------------------------

    def begin(self, phase: int, at: int | None = None) -> None:
        """Mark the start of ``phase`` (now, unless ``at`` is given)."""
        self._bounds[2 * phase] = clock_ns() if at is None else at
        self._begun |= 1 << phase
        self._current = phase

    def resume(self, phase: int) -> None:
        """Make ``phase`` current again, keeping its first start (or begin it now)."""
        i = 2 * phase
        if not self._bounds[i]:
            self._bounds[i] = clock_ns()
            self._begun |= 1 << phase
        self._bounds[i + 1] = 0
        self._current = phase

    def end_phase(self, phase: int, at: int | None = None) -> None:
        """Mark the end of ``phase``; a phase never begun starts where it ends."""
        end = clock_ns() if at is None else at
        i = 2 * phase
        if not self._bounds[i]:
            self._bounds[i] = end
            self._begun |= 1 << phase
        self._bounds[i + 1] = end
        if self._current == phase:
            self._current = -1

    def advance(self, phase: int) -> None:
        """The current phase, if any, ends and ``phase`` begins, at one instant (phases never
        overlap)."""
        now = clock_ns()
        if self._current >= 0:
            self.end_phase(self._current, now)
        self.begin(phase, now)

    def discard(self, phase: int) -> None:
        """Forget a phase that was begun too early: it did not happen (yet)."""
        i = 2 * phase
        self._bounds[i] = self._bounds[i + 1] = 0
        self._begun &= ~(1 << phase)
        if self._current == phase:
            self._current = -1

    def bounds_of(self, phase: int) -> tuple[int, int] | None:
        """``(start, end)`` of a phase that happened, else None. An open phase ends at the end;
        no phase reaches past the end (a hook still running in the program's thread as another
        thread ends the attempt, at uninstrument, records its instant after the end)."""
        i = 2 * phase
        start = self._bounds[i]
        return _clipped(start, self._bounds[i + 1], self.end_ns) if start else None

    def windows(self) -> list[tuple[int, int, int]]:
        """``(phase, start, end)`` of every phase that happened, in order: what
        :meth:`bounds_of` gives each of them, in one pass (the emitter reads them all)."""
        bounds = self._bounds
        closed = self.end_ns
        found = []
        for phase in _PHASES_IN[self._begun]:
            # _clipped, inline: the emitter reads every phase of every attempt
            start = bounds[2 * phase]
            if not start:
                continue
            end = bounds[2 * phase + 1] or closed or start
            if closed:
                start, end = min(start, closed), min(end, closed)
            found.append((phase, start, max(end, start)))
        return found

    @property
    def current_phase(self) -> int | None:
        """The phase begun most recently and not finished yet, if any."""
        return self._current if self._current >= 0 else None

    def duration_of(self, phase: int) -> float | None:
        """Seconds spent in ``phase``, or None when it did not happen."""
        bounds = self.bounds_of(phase)
        return None if bounds is None else (bounds[1] - bounds[0]) / 1e9

    def to_epoch_ns(self, mono_ns: int) -> int:
        """Convert a ``perf_counter_ns`` reading of this attempt to Unix epoch nanoseconds."""
        return self.epoch_start_ns + (mono_ns - self.start_ns)

    # -- body ---------------------------------------------------------------------------------

    def response_body(
        self, content_type: str | bytes | None, content_encoding: str | bytes | None = None
    ) -> None:
        """The response's headers are in: count its stream's events, and on an LLM route
        watch a JSON or streamed body for its tokens (a successful answer's only).
        ``content_encoding``: the encoding of the chunks :meth:`chunk` will see (None when the
        client decodes them first)."""
        stream = self.stream = counter_for(content_type)
        status = self.status_code
        if self.llm_route and (status is None or status < 400):
            self.body = body_watch_for(stream is not None, content_type, content_encoding)

    def chunk(self, data: bytes) -> None:
        """Record one body chunk as it arrives from the network (hot path: keep it cheap)."""
        now = clock_ns()
        last = self.last_chunk_ns
        body = self.body
        if last:
            gap = now - last
            if gap > self.gap_floor_ns:
                self._long_gap(last, now)
            if gap > self.token_max_gap_ns and body is not None and body.first_token_ns:
                self.token_max_gap_ns = gap
            gaps = self.gaps
            if gaps is not None:
                gaps.append(gap)
        else:
            self.first_chunk_ns = now
        self.last_chunk_ns = now
        self.chunks += 1
        stream = self.stream
        if stream is not None:
            stream.feed(data)
        if body is not None:
            body.previous = body.last
            body.last = data
            if body.watching:
                body.look(data, now)

    def arrivals(self, shortest: int = 1) -> list[tuple[int, int]]:
        """The windows that end at a chunk's arrival and that a stall of the program's loop may
        have delayed: the longest gaps (:attr:`long_gaps`, in their order), then the wait for
        the first chunk after the headers, if it lasted ``shortest`` (ns) or more (a stall
        the loop monitor counts is longer than its threshold: a shorter wait holds none)."""
        windows = [(start, end) for _, start, end in self.long_gaps]
        receive = self.bounds_of(RECEIVE)
        if receive is not None and self.first_chunk_ns - receive[0] >= max(shortest, 1):
            windows.append((receive[0], self.first_chunk_ns))
        return windows

    def _long_gap(self, start: int, end: int) -> None:
        """Keep the gap ``start``-``end`` among the longest (the shortest kept then goes)."""
        kept = self.long_gaps
        length = end - start
        if length > self.max_gap_ns:
            self.max_gap_ns = length
        if len(kept) < LONG_GAPS_KEPT:
            heappush(kept, (length, start, end))
            if len(kept) < LONG_GAPS_KEPT:
                return
        else:
            heapreplace(kept, (length, start, end))
        self.gap_floor_ns = kept[0][0]

    # -- end ----------------------------------------------------------------------------------

    def fail(self, error: BaseException, at: int | None = None) -> None:
        """Record the exception that ended the attempt, in the phase it interrupted (once, and
        not after the attempt ended)."""
        if self.error is None and not self.ended:
            self.error = error
            current = self._current
            self.failed_phase = current if current >= 0 else None
            if current >= 0:
                self.end_phase(current, at)

    def close(self, at: int | None = None) -> bool:
        """Mark the attempt's end. Returns False if it had already ended (end exactly once)."""
        if self.ended:
            return False
        self.ended = True
        self.end_ns = clock_ns() if at is None else at
        current = self._current
        if current >= 0:
            self.end_phase(current, self.end_ns)
        return True

    @property
    def duration(self) -> float:
        """Seconds from the attempt's start to its end (or to now, while it runs)."""
        return ((self.end_ns or clock_ns()) - self.start_ns) / 1e9
