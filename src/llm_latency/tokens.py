"""Watching an LLM response's body for its tokens, as the bytes arrive: when the first generated
content came (the time to first token), and the bytes at the body's start and end, where every
provider puts the model and the usage.

This is the observe side: per chunk it keeps references to the last two chunks, and only until
the first token it searches the chunk (a stream's first chunks are few). Parsing the usage out
of what it kept happens once, at the attempt's end (:mod:`llm_latency.usage`).

Content is what the model wrote, as each provider's profile describes it: a non-empty string
under a content key (``"content":"Hi"``, ``"text":"Hi"``, ``"delta":"Hi"``,
``"thinking":"..."``, tool-call ``"arguments"``); a tool call, a non-empty object or list of
objects under a content-object key (OpenAI's opening ``"tool_calls":[{...,"arguments":""}]``,
Gemini's ``"functionCall":{...}``, Ollama's ``"tool_calls"``, Bedrock's ``"toolUse"``); or a
block or item whose ``"type"`` opens a tool call (Anthropic's ``"tool_use"``, the Responses
API's ``"function_call"``). A tool call's opening names the tool: the model wrote it, so it is
the first token, though its arguments are still empty. A role-only delta
(``"content":""``), ``response.created``, ``message_start``, a text block's empty start, pings
and other control events carry none. JSON text never puts a backslash before a key's quote,
so an escaped key inside a generated string does not count. Bedrock's InvokeModel streams wrap each
event in base64 (``{"bytes":"..."}``): those payloads are decoded before the search.

A compressed body (``Content-Encoding``) is kept whole, up to :data:`KEEP_COMPRESSED` bytes,
since its end can only be read by decompressing it from its start; aiohttp hands the body over
decompressed already (its adapter says no encoding).
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Final

from llm_latency import providers

#: Bytes of the body's start and of its end that the usage is read from.
EDGE_BYTES: Final = 4096
#: A compressed body larger than this is not kept (its usage is then not read).
KEEP_COMPRESSED: Final = 1 << 20
#: Encodings the stdlib decompresses (the others need the client's own decoder).
ZLIB_ENCODINGS: Final = frozenset({"gzip", "x-gzip", "deflate"})
#: Bytes of a chunk carried into the search of the next one (a key split across two chunks).
_CARRY: Final = 64


def _names(names: tuple[str, ...]) -> bytes:
    return b"|".join(re.escape(name.encode()) for name in names)


_CONTENT: Final = re.compile(
    rb'(?<!\\)"(?:(?:'
    + _names(providers.CONTENT_KEYS)
    + rb')"\s*:\s*"(?=[^"])|(?:'
    + _names(providers.CONTENT_OBJECTS)
    + rb')"\s*:\s*(?:\{\s*"|\[\s*\{)|type"\s*:\s*"(?:'
    + _names(providers.CONTENT_TYPES)
    + rb')")'
)
BASE64_PAYLOAD: Final = re.compile(rb'"bytes"\s*:\s*"([A-Za-z0-9+/=]{4,})"')
_JSON_TYPES: Final = ("application/json", "+json")


class BodyWatch:
    """What one response body says of its tokens, fed by :meth:`Timeline.chunk`."""

    __slots__ = (
        "_carry",
        "compressed",
        "encoding",
        "first_token_ns",
        "head",
        "kept",
        "last",
        "parts",
        "previous",
        "streamed",
        "watching",
    )

    def __init__(self, streamed: bool, encoding: str | None) -> None:
        #: A stream: its first token is watched for.
        self.streamed = streamed
        #: The ``Content-Encoding`` the chunks are in, None for identity.
        self.encoding = encoding
        self.compressed = encoding is not None
        #: True while chunks are searched or kept (:meth:`look`).
        self.watching = True
        self.first_token_ns = 0
        #: The start of the first chunk, and the last two chunks (Timeline.chunk keeps them).
        self.head = b""
        self.previous = b""
        self.last = b""
        #: Every chunk of a compressed body, None once it grew past KEEP_COMPRESSED.
        self.parts: list[bytes] | None = [] if self.compressed else None
        self.kept = 0  # bytes in parts
        self._carry = b""

    def look(self, data: bytes, now: int) -> None:
        """A chunk arrived while :attr:`watching`: keep the head (or a compressed body) and
        search a stream for its first token."""
        if not self.head:
            self.head = data[:EDGE_BYTES]
        parts = self.parts
        if parts is not None:
            parts.append(data)
            self.kept += len(data)
            if self.kept > KEEP_COMPRESSED:
                self.parts = None
                self.watching = False
            return  # compressed bytes hold no visible token
        if not self.streamed:
            self.watching = False
            return
        text = self._carry + data if self._carry else data
        if has_content(text):
            self.first_token_ns = now
            self.watching = False
            self._carry = b""
        else:
            self._carry = text[-_CARRY:]

    def body_edges(self) -> tuple[bytes, bytes]:
        """The body's start and end as kept (decompressed when it came compressed; empty
        when it could not be kept or read)."""
        if self.compressed:
            body = decompress(self.parts, self.encoding)
            return body[:EDGE_BYTES], body[-EDGE_BYTES:]
        last = self.last
        if not self.previous and len(last) <= EDGE_BYTES:
            return last, last  # one chunk: the body's start is its end
        if len(last) >= EDGE_BYTES:
            return self.head, last[-EDGE_BYTES:]
        return self.head, self.previous[-(EDGE_BYTES - len(last)) :] + last


def has_content(text: bytes) -> bool:
    """Whether ``text`` (stream bytes) holds generated content, in base64 payloads too."""
    if _CONTENT.search(text) is not None:
        return True
    if b'"bytes"' not in text:
        return False
    return any(_CONTENT.search(payload) for payload in base64_payloads(text))


def base64_payloads(text: bytes) -> list[bytes]:
    """The decoded ``{"bytes":"..."}`` payloads of Bedrock's InvokeModel stream events."""
    decoded = []
    for match in BASE64_PAYLOAD.finditer(text):
        try:
            decoded.append(base64.b64decode(match.group(1), validate=True))
        except (binascii.Error, ValueError):
            continue
    return decoded


def decompress(parts: list[bytes] | None, encoding: str | None) -> bytes:
    """A kept compressed body, decompressed; empty when it cannot be."""
    if not parts or encoding is None:
        return b""
    data = b"".join(parts)
    try:
        if encoding in ZLIB_ENCODINGS:
            import zlib

            # 32 + MAX_WBITS reads a gzip or zlib header; a raw deflate stream needs -MAX_WBITS.
            wbits = 32 + zlib.MAX_WBITS if data[:1] in (b"\x1f", b"\x78") else -zlib.MAX_WBITS
            return zlib.decompressobj(wbits).decompress(data)
        if encoding == "br":
            import brotli  # type: ignore[import-not-found, import-untyped, unused-ignore]

            return bytes(brotli.decompress(data))
        if encoding == "zstd":
            import zstandard  # type: ignore[import-not-found, import-untyped, unused-ignore]

            return bytes(zstandard.ZstdDecompressor().decompressobj().decompress(data))
    except Exception:  # a decoder missing, or a body cut short: no usage, never an error
        return b""
    return b""


def body_watch_for(
    stream: bool, content_type: str | bytes | None, content_encoding: str | bytes | None
) -> BodyWatch | None:
    """A watch for an LLM answer's body when it is JSON or a stream (``stream``: the content
    type is a stream format), else None. ``content_encoding``: the encoding of the chunks the
    adapter will see (None when the client decodes them first)."""
    if not stream and not _is_json(content_type):
        return None
    if isinstance(content_encoding, bytes):
        content_encoding = content_encoding.decode("latin-1")
    encoding = (content_encoding or "").strip().lower() or None
    return BodyWatch(stream, None if encoding == "identity" else encoding)


def _is_json(content_type: str | bytes | None) -> bool:
    if not content_type:
        return False
    if isinstance(content_type, bytes):
        content_type = content_type.decode("latin-1")
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type.endswith(_JSON_TYPES)
