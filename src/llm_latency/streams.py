"""Counting the events of a streamed response as its bytes arrive, whatever its format.

Three formats carry LLM streams: Server-Sent Events (:mod:`llm_latency.sse`), newline-delimited
JSON (Ollama, Cohere's v1 API, TGI) and the AWS event stream (Bedrock's binary frames). Each
counter here sees every body chunk once, in order, and never parses a payload: it counts
boundaries, carrying across chunk edges what a boundary needs. :func:`counter_for` picks one by
the response's content type, from the provider profiles.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol

from llm_latency import providers
from llm_latency.provider_schema import AWS_EVENT_STREAM, NDJSON, SSE
from llm_latency.sse import SSECounter

#: The AWS event stream's prelude: total length (4 bytes, big-endian) first.
_LENGTH_BYTES: Final = 4
#: The smallest valid message: prelude (12 bytes) and message CRC (4 bytes).
_MIN_MESSAGE: Final = 16


class StreamCounter(Protocol):
    """Counts the events of one stream, fed its chunks in order."""

    def feed(self, data: bytes) -> None:
        """Account for the next chunk."""

    @property
    def events(self) -> int:
        """Events completed so far."""


class NDJSONCounter:
    """Newline-delimited JSON: each non-empty line is one event; a last line without its
    newline counts once the stream has it."""

    __slots__ = ("_counted", "_open")

    def __init__(self) -> None:
        self._counted = 0
        self._open = False  # content seen since the last newline

    def feed(self, data: bytes) -> None:
        """Account for the next chunk."""
        if b"\n" not in data:
            if not self._open and data.strip():
                self._open = True
            return
        lines = data.split(b"\n")
        # Blank lines are no events; the first line may have begun in an earlier chunk.
        counted = 1 if self._open or lines[0].strip() else 0
        for line in lines[1:-1]:
            if line.strip():
                counted += 1
        self._counted += counted
        self._open = bool(lines[-1].strip())

    @property
    def events(self) -> int:
        """Lines completed so far, and the last line if it has content."""
        return self._counted + (1 if self._open else 0)


class EventStreamCounter:
    """The AWS event stream (``application/vnd.amazon.eventstream``): binary messages, each
    starting with its own total length. Only the lengths are read; a frame whose length is
    impossible stops the counting (the stream is not one)."""

    __slots__ = ("_broken", "_counted", "_head", "_skip")

    def __init__(self) -> None:
        self._counted = 0
        self._skip = 0  # bytes left of the current message
        self._head = b""  # the start of a length prefix split across chunks
        self._broken = False

    def feed(self, data: bytes) -> None:
        """Account for the next chunk."""
        if self._broken:
            return
        position = 0
        size = len(data)
        while position < size:
            if self._skip:
                step = min(self._skip, size - position)
                self._skip -= step
                position += step
                if not self._skip:
                    self._counted += 1
                continue
            wanted = _LENGTH_BYTES - len(self._head)
            self._head += data[position : position + wanted]
            position += wanted
            if len(self._head) < _LENGTH_BYTES:
                return
            length = int.from_bytes(self._head, "big")
            self._head = b""
            if length < _MIN_MESSAGE:
                self._broken = True
                return
            self._skip = length - _LENGTH_BYTES

    @property
    def events(self) -> int:
        """Messages received whole so far."""
        return self._counted


_COUNTERS: Final[dict[str, Callable[[], StreamCounter]]] = {
    SSE: SSECounter,
    NDJSON: NDJSONCounter,
    AWS_EVENT_STREAM: EventStreamCounter,
}


def counter_for(content_type: str | bytes | None) -> StreamCounter | None:
    """A fresh counter for a response of this ``Content-Type``, or None when it is no stream
    format a provider uses."""
    if not content_type:
        return None
    if isinstance(content_type, bytes):
        content_type = content_type.decode("latin-1")
    media_type = content_type.split(";", 1)[0].strip().lower()
    kind = providers.STREAM_TYPES.get(media_type)
    return None if kind is None else _COUNTERS[kind]()
