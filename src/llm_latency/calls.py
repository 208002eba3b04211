"""Logical calls: the attempts of one operation (an SDK call, a ``llm_latency.retry`` call, a
urllib3 ``urlopen`` with its own retries) and the waits between them.

A :class:`LogicalCall` is a small state machine with no OpenTelemetry in it: the adapters and
the retry helper mark where a call begins and ends; the emitter tells it when each attempt
starts and ends, and it answers with the attempt's number, the wait to emit as a
``retry.backoff`` span, and whether the call is over.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, NamedTuple

from llm_latency.clock import clock_ns


class Backoff(NamedTuple):
    """The wait between a failed attempt of a call and the next one: what to emit for it."""

    reason: str
    retry_after: float | None
    host: str
    start_epoch_ns: int
    end_epoch_ns: int


class LogicalCall:
    """One operation that may take several HTTP attempts. Its state changes only through its
    methods, which the emitter calls as attempts start and end and the retry helper calls as
    it numbers its attempts."""

    __slots__ = (
        "_helper_attempt",
        "_last_end_epoch_ns",
        "_last_reason",
        "_last_retry_after",
        "_open_attempts",
        "_returned",
        "answer",
        "attempts",
        "first_token_ns",
        "last_host",
        "numbers_attempts",
        "own_backoffs",
        "request_id",
        "span",
        "start_ns",
    )

    def __init__(
        self, span: Any = None, *, own_backoffs: bool = False, numbers_attempts: bool = False
    ) -> None:
        #: The logical parent span llm-latency opened (None when the program's or a GenAI
        #: span is the parent, or when the call only groups attempts).
        self.span = span
        #: True when the caller (the retry helper) emits the backoff spans itself.
        self.own_backoffs = own_backoffs
        #: True when the attempts carry their number in the call as their resend count (an
        #: SDK call, whose SDK may send no retry-count header of its own).
        self.numbers_attempts = numbers_attempts
        #: When the call started (``clock_ns``): its time to first token counts from here,
        #: its failed attempts and the waits between them included.
        self.start_ns = clock_ns()
        #: Attempts started so far.
        self.attempts = 0
        #: The GenAI attributes (model, usage, time to first token) of the latest attempt
        #: that carried an answer, and when its first token came (``clock_ns``, 0 when it
        #: has none): the call's span gets them when it ends, the time to first token from
        #: the call's start (:meth:`answered`).
        self.answer: dict[str, Any] | None = None
        self.first_token_ns = 0
        #: The provider's request id of the latest attempt that carried one: the call's span
        #: gets it when it ends.
        self.request_id: str | None = None
        #: The host of the latest attempt that ended.
        self.last_host = ""
        self._helper_attempt = 0
        self._open_attempts = 0
        self._returned = False
        self._last_end_epoch_ns = 0
        self._last_reason: str | None = None
        self._last_retry_after: float | None = None

    def answered(self, answer: dict[str, Any], first_token_ns: int) -> None:
        """An attempt carried an answer: its GenAI attributes, and when its first token came
        (``clock_ns``; 0 for none)."""
        self.answer = answer
        self.first_token_ns = first_token_ns

    def first_token_since_start(self) -> float | None:
        """Seconds from the call's start to its answer's first token, None without one."""
        if not self.first_token_ns:
            return None
        return (self.first_token_ns - self.start_ns) / 1e9

    def number_next(self, attempt: int) -> None:
        """The retry helper's attempt ``attempt`` (from 0) starts: its HTTP attempts carry it
        as their resend count."""
        self._helper_attempt = attempt

    def attempt_started(self, start_epoch_ns: int, resend_count: int) -> tuple[int, Backoff | None]:
        """An attempt of this call starts. Returns its resend count, and the wait since the
        previous attempt when that one failed and the call emits its own backoffs (after a
        success, as after a redirect, the next attempt is no retry)."""
        backoff = None
        if self._last_reason is not None and self._last_end_epoch_ns and not self.own_backoffs:
            backoff = Backoff(
                self._last_reason,
                self._last_retry_after,
                self.last_host,
                self._last_end_epoch_ns,
                max(start_epoch_ns, self._last_end_epoch_ns),
            )
        if self.numbers_attempts:
            resend_count = max(resend_count, self.attempts)
        self.attempts += 1
        self._open_attempts += 1
        return max(resend_count, self._helper_attempt), backoff

    def attempt_ended(
        self, end_epoch_ns: int, reason: str | None, retry_after: float | None, host: str
    ) -> bool:
        """An attempt of this call ended (``reason``: its error type or failed status, None
        for a success). True when the whole call is over: it returned, nothing is open."""
        self._open_attempts -= 1
        self._last_end_epoch_ns = end_epoch_ns
        self._last_reason = reason
        self._last_retry_after = retry_after
        self.last_host = host
        return self._returned and self._open_attempts <= 0

    @property
    def failed_last(self) -> str | None:
        """When no attempt is open and the latest one failed, why (its error type or status):
        an SDK that returns a failed response and raises only above the call (cohere's)."""
        return self._last_reason if self._open_attempts <= 0 else None

    def returned(self) -> bool:
        """The operation returned (or raised). True when the whole call is over; False while
        an attempt is still open (a stream still being read ends it later)."""
        self._returned = True
        return self._open_attempts <= 0


#: The logical call running in this task or thread, if any.
current_call: ContextVar[LogicalCall | None] = ContextVar("llm_latency_call", default=None)
