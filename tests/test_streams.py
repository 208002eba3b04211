"""Counting the events of NDJSON and AWS event-stream bodies: exact however the body is cut
into chunks, and in agreement with the real decoders (json per line; botocore's event-stream
parser)."""

from __future__ import annotations

import binascii
import itertools
import json
import struct

from botocore.eventstream import EventStreamBuffer
from hypothesis import given
from hypothesis import strategies as st

from llm_latency.sse import SSECounter
from llm_latency.streams import EventStreamCounter, NDJSONCounter, StreamCounter, counter_for


def fed(counter: StreamCounter, chunks: list[bytes]) -> int:
    for chunk in chunks:
        counter.feed(chunk)
    return counter.events


def cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def event_message(payload: bytes, event_type: str = "chunk") -> bytes:
    """One AWS event-stream message, as Bedrock sends it (headers, payload, both CRCs)."""
    name = b":event-type"
    value = event_type.encode()
    headers = bytes([len(name)]) + name + b"\x07" + struct.pack(">H", len(value)) + value
    total = 12 + len(headers) + len(payload) + 4
    prelude = struct.pack(">II", total, len(headers))
    prelude += struct.pack(">I", binascii.crc32(prelude))
    message = prelude + headers + payload
    return message + struct.pack(">I", binascii.crc32(message))


def test_ollama_lines() -> None:
    body = b"".join(
        json.dumps({"message": {"content": word}, "done": word == "!"}).encode() + b"\n"
        for word in ("Hello", " world", "!")
    )
    assert fed(NDJSONCounter(), [body]) == 3
    assert fed(NDJSONCounter(), [body[:-1]]) == 3  # the last line without its newline
    assert fed(NDJSONCounter(), [b"\n\r\n  \n"]) == 0  # blank lines are no events
    assert fed(NDJSONCounter(), [b'{"a":1}\r\n', b'{"b"', b":2}\r\n\r\n"]) == 2


@given(
    st.lists(st.sampled_from([b'{"a": 1}', b"", b"  ", b"{}", b'{"text": "x y"}']), max_size=12),
    st.sampled_from([b"\n", b"\r\n"]),
    st.lists(st.integers(min_value=0), max_size=8),
)
def test_ndjson_counts_each_line_with_content_however_cut(
    lines: list[bytes], ending: bytes, cuts: list[int]
) -> None:
    body = b"".join(line + ending for line in lines)
    expected = sum(1 for line in lines if line.strip())
    assert fed(NDJSONCounter(), cut(body, cuts)) == expected


@given(
    st.lists(st.binary(max_size=300), max_size=10),
    st.lists(st.integers(min_value=0), max_size=10),
)
def test_event_stream_agrees_with_botocores_parser_however_cut(
    payloads: list[bytes], cuts: list[int]
) -> None:
    body = b"".join(event_message(payload) for payload in payloads)
    decoder = EventStreamBuffer()
    decoder.add_data(body)
    assert fed(EventStreamCounter(), cut(body, cuts)) == len(list(decoder)) == len(payloads)


def test_event_stream_counts_only_whole_messages_and_stops_on_garbage() -> None:
    message = event_message(b'{"bytes": "eyJ0eXBlIjoiY29udGVudF9ibG9ja19kZWx0YSJ9"}')
    assert fed(EventStreamCounter(), [message + message[:10]]) == 1
    # Not an event stream (a JSON error body under the wrong type): no count, no exception.
    assert fed(EventStreamCounter(), [b'{"message": "throttled"}']) == 0


def test_the_counter_follows_the_content_type() -> None:
    assert isinstance(counter_for("text/event-stream; charset=utf-8"), SSECounter)
    assert isinstance(counter_for(b"application/x-ndjson"), NDJSONCounter)
    assert isinstance(counter_for("Application/Stream+JSON"), NDJSONCounter)  # Cohere v1
    assert isinstance(counter_for("application/vnd.amazon.eventstream"), EventStreamCounter)
    assert counter_for("application/json") is None
    assert counter_for(None) is None
