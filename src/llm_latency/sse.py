"""Counting Server-Sent Events in a byte stream as it arrives, chunk by chunk.

An SSE event ends at a blank line: a line terminator (``\\r\\n``, ``\\n`` or ``\\r``) right after
another. We count each run of two or more terminators that follows some content as one event;
a run may straddle chunk boundaries (even split inside ``\\r\\n``), so the trailing run of a chunk
is carried over and decided when content follows or when the stream ends. Comment-only blocks
(``: keep-alive``) count as events too: telling them apart would mean parsing every line.
"""

from __future__ import annotations

import re
from typing import Final

_TERMINATOR_RUN: Final = re.compile(rb"[\r\n]+")
# A run of terminator bytes that holds a single line terminator; any other run holds a blank line.
_SINGLE_TERMINATORS: Final = frozenset((b"\r", b"\n", b"\r\n"))
_TERMINATORS: Final = b"\r\n"


class SSECounter:
    """Incremental, boundary-exact SSE event counter."""

    __slots__ = ("_counted", "_fast", "_had_content", "_tail")

    def __init__(self) -> None:
        self._counted = 0
        self._tail = b""
        self._had_content = False
        #: Chunks of the commonest kind (one event of one line) in a row, not yet added to the
        #: state above: each completes the run carried before it and carries its own "\n\n".
        self._fast = 0

    def feed(self, data: bytes) -> None:
        """Account for the next chunk of the stream."""
        size = len(data)
        # The commonest chunk of LLM streams: one event of one line, "data: {...}\n\n". Its
        # first "\n" is the last but one byte, the last is "\n", it starts with content (a
        # byte above "\r"), and holds no "\r" (byte searches: a two-byte one costs more).
        if (
            size > 2
            and data.find(10) == size - 2
            and data[-1] == 10
            and data[0] > 13
            and 13 not in data
        ):
            self._fast += 1
            return
        if self._fast:
            self._settle()
        if not data:
            return
        tail = self._tail
        if (
            size > 2
            and data[0] not in _TERMINATORS
            and data.endswith(b"\n\n")
            and data.find(b"\r") < 0
            and data.find(b"\n\n\n") < 0
        ):
            # Several whole events, each ending in a blank line that is exactly "\n\n". Every
            # "\n\n" ends one; the run carried before the chunk is complete, and the chunk's
            # last one is carried until content follows.
            completed = data.count(b"\n\n") - 1
            if tail and self._had_content and tail not in _SINGLE_TERMINATORS:
                completed += 1
            self._counted += completed
            self._tail = b"\n\n"
            self._had_content = True
            return
        if tail:
            if data[0] in _TERMINATORS:
                data = tail + data  # the run goes on into this chunk
            else:
                # Content follows: the carried run is complete (the common case for LLM
                # streams, whose chunks end with a blank line).
                if self._had_content and tail not in _SINGLE_TERMINATORS:
                    self._counted += 1
                self._tail = b""
        end = len(data.rstrip(_TERMINATORS))
        if not end:
            # Only terminators so far: extend the pending run; once it holds a blank line
            # any longer run is the same, so keep it short.
            self._tail = data if len(data) <= 4 else b"\n\n"
            return
        self._tail = data[end:]
        # Any run of terminators other than a single one holds "\n\n", "\r\r" or "\n\r":
        # without those the chunk's body ends no event (and the regex need not run).
        if (
            data.find(b"\n\n", 0, end) < 0
            and data.find(b"\r\r", 0, end) < 0
            and data.find(b"\n\r", 0, end) < 0
        ):
            self._had_content = True
            return
        runs = _TERMINATOR_RUN.findall(data, 0, end)
        if runs:
            count = 0
            for run in runs:
                if run not in _SINGLE_TERMINATORS:
                    count += 1
            # A blank run at the very start only ends an event if content came before it.
            if (
                not self._had_content
                and data[0] in _TERMINATORS
                and runs[0] not in (_SINGLE_TERMINATORS)
            ):
                count -= 1
            self._counted += count
        self._had_content = True

    def _settle(self) -> None:
        """Add the chunks of one event counted in :attr:`_fast` to the carried state."""
        self._counted += self._fast - 1 + self._carried()
        self._fast = 0
        self._tail = b"\n\n"
        self._had_content = True

    def _carried(self) -> int:
        """1 if the carried run ends an event (a blank line after content), else 0."""
        tail = self._tail
        return 1 if tail and self._had_content and tail not in _SINGLE_TERMINATORS else 0

    @property
    def events(self) -> int:
        """Events completed so far (a trailing blank line counts once the stream has content).
        Read without changing the counter: another thread may read it while chunks come."""
        fast = self._fast
        if fast:  # each completes the run before it; the last one's "\n\n" ends its own
            return self._counted + self._carried() + fast
        return self._counted + self._carried()
