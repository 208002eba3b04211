"""Logical calls: the attempts of one operation (an SDK call, a ``llm_latency.retry`` call, a
urllib3 ``urlopen`` with its own retries) and the waits between them.

A :class:`LogicalCall` is plain data, like a Timeline: the adapters and the retry helper mark
where a call begins and ends; the emitter reads it to parent the attempts, to number them, and
to emit a ``retry.backoff`` span for each wait between two of them.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any


class LogicalCall:
    """One operation that may take several HTTP attempts."""

    __slots__ = (
        "attempts",
        "helper_attempt",
        "last_end_epoch_ns",
        "last_host",
        "last_reason",
        "last_retry_after",
        "open_attempts",
        "own_backoffs",
        "returned",
        "span",
    )

    def __init__(self, span: Any = None, *, own_backoffs: bool = False) -> None:
        #: The logical parent span llm-latency opened (None when the program's or a GenAI
        #: span is the parent, or when the call only groups attempts).
        self.span = span
        #: True when the caller (the retry helper) emits the backoff spans itself.
        self.own_backoffs = own_backoffs
        self.attempts = 0
        self.helper_attempt = 0
        self.open_attempts = 0
        self.returned = False
        self.last_end_epoch_ns = 0
        self.last_reason: str | None = None
        self.last_retry_after: float | None = None
        self.last_host = ""


#: The logical call running in this task or thread, if any.
current_call: ContextVar[LogicalCall | None] = ContextVar("llm_latency_call", default=None)
