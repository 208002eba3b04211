"""The tokens of one answer, read once when its attempt ends: from the start and end of the body
that :class:`~llm_latency.tokens.BodyWatch` kept, and from the providers' usage headers.

No body is parsed as a whole. In the body's start (its first usage object: Anthropic's
``message_start``) and its end (its last: the final usage chunk, ``message_delta``, a JSON
answer's ``usage``), a byte search finds the key a provider's usage follows
(``providers.USAGE_AT``), and the usage fields (``providers.USAGE_FIELDS``) are read in the
:data:`WINDOW` bytes after it; the last value of a field wins (Anthropic's ``message_delta``
usage is cumulative; Gemini repeats its usage in every chunk). A count the server did not send
stays None: nothing is estimated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from llm_latency import headers, providers
from llm_latency.provider_schema import (
    CACHE_READ,
    CACHE_READ_BESIDE,
    CACHE_WRITE_BESIDE,
    DECODE,
    DECODE_NANOSECONDS,
    DECODE_SECONDS,
    GATEWAY_OVERHEAD,
    INPUT,
    MILLISECONDS,
    OUTPUT,
    PREFILL,
    PREFILL_NANOSECONDS,
    PREFILL_SECONDS,
    QUEUE,
    QUEUE_SECONDS,
    REASONING,
    REASONING_BESIDE,
    SECONDS,
)
from llm_latency.tokens import BodyWatch, base64_payloads

_NUMBER: Final = rb"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
# A key stands after "{", "," or white space; a match behind a backslash would be inside a
# string. The byte before the key is matched, not looked behind at: a look-behind is tried at
# every byte and makes the search several times slower.
_FIELD: Final = re.compile(
    rb'[{,\s]"('
    + b"|".join(re.escape(key.encode()) for key in providers.USAGE_FIELDS)
    + rb')"\s*:\s*'
    + _NUMBER
)
_MODEL: Final = re.compile(rb'"(?:model|modelVersion)"\s*:\s*"([^"\\]{1,200})"')
#: The keys usage objects follow, as they stand in JSON text; a key that starts with another
#: one is left to that one's search, which finds both (``"usage`` finds ``"usageMetadata``).
_USAGE_AT: Final = tuple(
    f'"{key}'.encode()
    for key in providers.USAGE_AT
    if not any(key != other and key.startswith(other) for other in providers.USAGE_AT)
)
#: Bytes read after such a key: a usage object with its details (Cohere's holds two).
WINDOW: Final = 1024
#: Occurrences of ``"model`` tried before giving up (``"models"`` and the like come first).
_MODEL_TRIES: Final = 3
#: The counts a provider sends beside its totals, to be added to them.
_BESIDE: Final = frozenset([CACHE_READ_BESIDE, CACHE_WRITE_BESIDE, REASONING_BESIDE])
_KINDS: Final = {key.encode(): kind for key, kind in providers.USAGE_FIELDS.items()}
#: Seconds per unit of the server-split fields.
_SPLIT_FIELDS: Final = {
    QUEUE_SECONDS: (QUEUE, 1.0),
    PREFILL_SECONDS: (PREFILL, 1.0),
    DECODE_SECONDS: (DECODE, 1.0),
    PREFILL_NANOSECONDS: (PREFILL, 1e-9),
    DECODE_NANOSECONDS: (DECODE, 1e-9),
}
_UNIT_SECONDS: Final = {MILLISECONDS: 1e-3, SECONDS: 1.0}
#: Every header that counts tokens or splits the server's time.
_HEADERS: Final = frozenset(
    [h for h, _ in providers.USAGE_HEADERS] + [h for h, _, _ in providers.SERVER_SPLIT_HEADERS]
)


@dataclass
class Usage:
    """What the server said of an answer's tokens and of its own time; None when not said."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    reasoning_tokens: int | None = None
    model: str | None = None
    #: Prompt tokens written to the provider's cache (Anthropic's, Bedrock's: counted in
    #: ``input_tokens``).
    cache_write_tokens: int | None = None
    queue_time: float | None = None
    prefill_time: float | None = None
    decode_time: float | None = None
    gateway_overhead: float | None = None

    @property
    def empty(self) -> bool:
        """Nothing at all was said."""
        return vars(self) == _NOTHING


_NOTHING: Final = vars(Usage())


def read_usage(watch: BodyWatch | None, found: Mapping[str, list[str]]) -> Usage:
    """The usage of an answer from its watched body (None: not watched) and its allow-listed
    response headers ``found``."""
    fields: dict[str, float] = {}
    model = None
    if watch is not None:
        head, tail = watch.body_edges()
        regions = [(head, False), (tail, True)] if head is not tail else [(tail, True)]
        if watch.streamed and b'"bytes"' in tail:
            regions += [(payload, True) for payload in base64_payloads(tail)]
        for region, last in regions:
            for window in _usage_windows(region, last):
                for key, value in _FIELD.findall(window):
                    fields[_KINDS[key]] = float(value)
        model = _model(head) or (None if head is tail else _model(tail))
    said = not _HEADERS.isdisjoint(found)
    if said:
        for header, kind in providers.USAGE_HEADERS:
            value = headers.parse_number(headers.first(found, header))
            if value is not None and kind not in fields:
                fields[kind] = value
    usage = _counts(fields) if fields else Usage()
    usage.model = model or headers.first(found, "openai-model")
    if not _SPLIT_FIELDS.keys().isdisjoint(fields):
        for kind, (part, scale) in _SPLIT_FIELDS.items():
            if kind in fields and fields[kind] >= 0:
                _add_part(usage, part, fields[kind] * scale)
    if said:
        for header, part, unit in providers.SERVER_SPLIT_HEADERS:
            seconds = headers.parse_number(headers.first(found, header))
            if seconds is not None and seconds >= 0:
                _add_part(usage, part, seconds * _UNIT_SECONDS[unit])
    return usage


def _usage_windows(region: bytes, last: bool) -> list[bytes]:
    """Each usage key in ``region`` and the bytes after it, from the byte before it (what
    ``_FIELD`` matches first): the key's last occurrence (``last``) or its first, a key behind
    a backslash (inside a generated string) passed over."""
    windows = []
    for key in _USAGE_AT:
        at = region.rfind(key) if last else region.find(key)
        while at > 0 and region[at - 1] == 92:
            at = region.rfind(key, 0, at) if last else region.find(key, at + 1)
        if at > 0:
            windows.append(region[at - 1 : at + WINDOW])
        elif at == 0:  # the region starts with the key: nothing stands before it
            windows.append(b"{" + region[:WINDOW])
    return windows


def _model(region: bytes) -> str | None:
    """The model the region names first (every event of a stream names the same)."""
    at = region.find(b'"model')
    for _ in range(_MODEL_TRIES):
        if at < 0:
            return None
        match = _MODEL.match(region, at)
        if match is not None and (not at or region[at - 1] != 92):
            return match.group(1).decode("utf-8", "replace")
        at = region.find(b'"model', at + 1)
    return None


def _counts(fields: Mapping[str, float]) -> Usage:
    """The token counts of ``fields``; the ones a provider counts beside its totals (cache
    reads and writes, reasoning) added to them."""
    get = fields.get
    # Inline, not through _count: this runs for every answer.
    inputs = None if (value := get(INPUT)) is None or value < 0 else int(value)
    outputs = None if (value := get(OUTPUT)) is None or value < 0 else int(value)
    cached = None if (value := get(CACHE_READ)) is None or value < 0 else int(value)
    reasoning = None if (value := get(REASONING)) is None or value < 0 else int(value)
    if _BESIDE.isdisjoint(fields):
        return Usage(inputs, outputs, cached, reasoning)
    cache_beside = _count(get(CACHE_READ_BESIDE))
    write_beside = _count(get(CACHE_WRITE_BESIDE))
    reasoning_beside = _count(get(REASONING_BESIDE))
    if inputs is not None:
        inputs += (cache_beside or 0) + (write_beside or 0)
    if outputs is not None:
        outputs += reasoning_beside or 0
    return Usage(
        inputs,
        outputs,
        cached if cached is not None else cache_beside,
        reasoning if reasoning is not None else reasoning_beside,
        cache_write_tokens=write_beside,
    )


def _count(value: float | None) -> int | None:
    """A token count as the server sent it; None when it sent none (or no count)."""
    return None if value is None or value < 0 else int(value)


def _add_part(usage: Usage, part: str, seconds: float) -> None:
    name = {
        QUEUE: "queue_time",
        PREFILL: "prefill_time",
        DECODE: "decode_time",
        GATEWAY_OVERHEAD: "gateway_overhead",
    }[part]
    setattr(usage, name, (getattr(usage, name) or 0.0) + seconds)
