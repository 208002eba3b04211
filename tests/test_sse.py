"""The incremental SSE event counter: exact however the stream is cut into chunks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llm_latency.sse import SSECounter


def count(*chunks: bytes) -> int:
    counter = SSECounter()
    for chunk in chunks:
        counter.feed(chunk)
    return counter.events


def test_openai_and_anthropic_formats() -> None:
    openai = b'data: {"a": 1}\n\ndata: {"a": 2}\n\ndata: [DONE]\n\n'
    assert count(openai) == 3
    anthropic = (
        b"event: message_start\ndata: {}\n\n"
        b"event: content_block_delta\ndata: {}\n\n"
        b"event: message_stop\ndata: {}\n\n"
    )
    assert count(anthropic) == 3


def test_line_endings() -> None:
    assert count(b"data: a\r\n\r\ndata: b\r\n\r\n") == 2
    assert count(b"data: a\r\rdata: b\r\r") == 2
    assert count(b"data: a\n\r\ndata: b\r\n\n") == 2


def test_incomplete_event_and_leading_blank_lines() -> None:
    assert count(b"\n\n\ndata: a\n\ndata: b") == 1
    assert count(b"data: a\n") == 0
    assert count(b"") == 0
    assert count(b"data: a\n\n\n\n\n") == 1


def test_split_inside_crlf() -> None:
    assert count(b"data: a\r", b"\n\r", b"\n") == 1
    assert count(b"data: a\r\n", b"\r\n", b"data: b\r", b"\n\r\n") == 2


_LINE = st.sampled_from([b"data: x", b"event: e", b": ping", b"id: 7", b'data: {"k": 1}'])
_EOL = st.sampled_from([b"\n", b"\r\n", b"\r"])


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, int]:
    """A well-formed SSE stream and its event count."""
    events = draw(st.lists(st.lists(st.tuples(_LINE, _EOL), min_size=1, max_size=4), max_size=8))
    out = b""
    for event in events:
        for line, eol in event:
            out += line + eol
        blank = draw(_EOL)
        # "\r" then "\n" would be one CRLF terminator, not a blank line.
        out += b"\r" if out.endswith(b"\r") and blank == b"\n" else blank
    return out, len(events)


@given(streams(), st.data())
def test_any_chunking_gives_the_same_count(stream: tuple[bytes, int], data: st.DataObject) -> None:
    raw, expected = stream
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=12)))
    chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert count(raw) == expected
    assert count(*chunks) == expected


@given(st.binary(max_size=200), st.data())
def test_never_raises_and_chunking_does_not_matter(raw: bytes, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=8)))
    chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert count(*chunks) == count(raw)


_ONE_EVENT = st.sampled_from([b'data: {"k": 1}\n\n', b"data: x\n\n", b": ping\n\n"])


@given(st.lists(st.one_of(_ONE_EVENT, st.binary(max_size=12)), max_size=16))
def test_one_event_chunks_among_others_count_as_byte_by_byte(chunks: list[bytes]) -> None:
    """Chunks of one one-line event each (the counter's fast path, counted lazily) among any
    others: after every chunk the count is the one a byte-by-byte feed of the same bytes gives
    (one-byte chunks never take the fast path)."""
    counter, reference = SSECounter(), SSECounter()
    for chunk in chunks:
        counter.feed(chunk)
        for byte in chunk:
            reference.feed(bytes([byte]))
        assert counter.events == reference.events
