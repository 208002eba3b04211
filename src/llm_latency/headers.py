"""Which response headers become span attributes, and how they are read.

Only allow-listed headers are ever recorded. Headers that carry credentials or session state
(``authorization``, ``set-cookie``, ...) are refused even when asked for, with a warning.
"""

from __future__ import annotations

import datetime
import email.utils
import functools
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from llm_latency import providers
from llm_latency.provider_schema import MILLISECONDS, SERVER_TIMING

_logger = logging.getLogger(__name__)

REQUEST_ID_HEADERS: Final = providers.REQUEST_ID_HEADERS
#: Remaining-budget headers and the kind of budget each counts (``requests``, ``tokens``, ...).
RATELIMIT_REMAINING_HEADERS: Final = providers.RATELIMIT_REMAINING_HEADERS
#: The header that says when a remaining header's window resets, by remaining header.
RATELIMIT_RESET_HEADERS: Final = providers.RATELIMIT_RESET_HEADERS
#: Request headers that number an SDK's attempts.
RETRY_COUNT_HEADERS: Final = providers.RETRY_COUNT_HEADERS
_DURATION_PART: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_SECONDS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_SERVER_TIMING_DUR: Final = re.compile(r";\s*dur=([0-9.]+)", re.IGNORECASE)
_ATTEMPT: Final = re.compile(r"attempt=(\d+)")

#: Captured by default: request ids, server timing, model, rate-limit state and retry hints of
#: every provider profile.
DEFAULT_RESPONSE_HEADERS: Final[tuple[str, ...]] = providers.DEFAULT_RESPONSE_HEADERS

#: Never captured, whatever the configuration says.
SENSITIVE_HEADERS: Final = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "proxy-authenticate",
        "www-authenticate",
        "api-key",
        "x-api-key",
        "x-goog-api-key",
        "cookie",
        "set-cookie",
        "set-cookie2",
    }
)


def resolve_capture_list(extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The lower-cased header names to capture: defaults and ``extra`` (the option
    ``capture_response_headers``: the argument's names and those of
    ``OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_RESPONSE``, as ``Settings`` bound them).
    Sensitive names are dropped with a warning; regular expressions are not supported.
    """
    wanted = [*DEFAULT_RESPONSE_HEADERS, *extra]
    names: dict[str, None] = {}
    for raw in wanted:
        name = raw.strip().lower()
        if not name:
            continue
        if name in SENSITIVE_HEADERS:
            _logger.warning(
                "llm-latency: refusing to capture the %r response header: it carries "
                "credentials or session state",
                name,
            )
            continue
        names[name] = None
    return tuple(names)


def attribute_name(header: str) -> str:
    """``http.response.header.<name>``, as the HTTP semantic conventions spell it."""
    return "http.response.header." + header


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return str(value)


def select(raw_headers: Sequence[tuple[Any, Any]], wanted: frozenset[str]) -> dict[str, list[str]]:
    """The wanted headers of a raw ``(name, value)`` list, names lower-cased, values in order.
    A name in bytes (aiohttp's and httpcore's raw headers) is compared as bytes: only the
    wanted ones are decoded (a provider sends twenty headers, and a few are wanted)."""
    encoded = _encoded(wanted)
    found: dict[str, list[str]] = {}
    for raw_name, raw_value in raw_headers:
        if type(raw_name) is bytes:
            lowered = raw_name.lower()
            if lowered not in encoded:
                continue
            name = lowered.decode("ascii")
        else:
            name = _text(raw_name).lower()
            if name not in wanted:
                continue
        found.setdefault(name, []).append(_text(raw_value).strip())
    return found


@functools.lru_cache(maxsize=16)
def _encoded(wanted: frozenset[str]) -> frozenset[bytes]:
    """The wanted names as bytes (header names are ASCII tokens: others cannot match)."""
    return frozenset(name.encode("ascii") for name in wanted if name.isascii())


def first(found: Mapping[str, list[str]], *names: str) -> str | None:
    """The first value of the first of ``names`` present in ``found``."""
    for name in names:
        values = found.get(name)
        if values:
            return values[0]
    return None


def retry_after(retry_after_ms: str | None, retry_after_value: str | None) -> float | None:
    """Seconds the server asked the client to wait: ``retry-after-ms``, else ``Retry-After``
    (seconds, or an HTTP date). None when neither is present or readable."""
    milliseconds = parse_number(retry_after_ms)
    if milliseconds is not None and milliseconds >= 0:
        return milliseconds / 1000.0
    seconds = parse_number(retry_after_value)
    if seconds is not None:
        return max(seconds, 0.0)
    if retry_after_value:
        try:
            when = email.utils.parsedate_to_datetime(retry_after_value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        return max((when - datetime.datetime.now(datetime.timezone.utc)).total_seconds(), 0.0)
    return None


def parse_duration(value: str | None) -> float | None:
    """Seconds in a Go-style duration (``6m0s``, ``1.5s``, ``20ms``), or a plain number of
    seconds; None when absent or unreadable."""
    if value is None:
        return None
    number = parse_number(value)
    if number is not None:
        return number if number >= 0 else None
    text = value.strip()
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


def parse_number(value: str | None) -> float | None:
    """A header value as a float, or None when absent or not a plain finite number."""
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    if number != number or number in (float("inf"), float("-inf")):
        return None
    return number


def server_time(found: Mapping[str, list[str]]) -> float | None:
    """Seconds the provider says it spent on the request, from the first server-time header
    of the provider profiles present in ``found``; None when none is there or readable."""
    if not found:
        return None
    for name, kind in providers.SERVER_TIME_HEADERS:
        values = found.get(name)
        if not values:
            continue
        value = values[0]
        if kind == SERVER_TIMING:
            durations = [float(d) for d in _SERVER_TIMING_DUR.findall(value)]
            number = max(durations) if durations else None
            kind = MILLISECONDS
        else:
            number = parse_number(value)
        if number is not None and number >= 0:
            return number / 1000.0 if kind == MILLISECONDS else number
    return None


def parse_reset(value: str | None) -> float | None:
    """Seconds until a rate-limit window resets: a duration (``parse_duration``) or an
    RFC 3339 timestamp (Anthropic's); None when absent, unreadable or past."""
    seconds = parse_duration(value)
    if seconds is not None or value is None:
        return seconds
    try:
        when = datetime.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    left = (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    return left if left >= 0 else None


#: ``llm_latency.connection.closed_by`` of a request that asks for its connection to close.
CONNECTION_CLOSE: Final = "Connection: close"


def asks_to_close(request_headers: Any) -> bool:
    """Whether ``request_headers`` (a mapping with ``get``, case-insensitive where the client's
    is) carry ``Connection: close``: the server closes the connection after its answer."""
    value = request_headers.get("Connection") or request_headers.get("connection")
    return isinstance(value, (str, bytes)) and value.strip().lower() in ("close", b"close")


def request_resend_count(request_headers: Any) -> int:
    """The resend count an SDK's retry-count header in ``request_headers`` gives (any mapping
    with ``get``, case-insensitive where the client's is), 0 when there is none."""
    for name in RETRY_COUNT_HEADERS:
        value = request_headers.get(name)
        if value is not None:
            return resend_count(value)
    return 0


def select_from_multidict(mapping: Any, wanted: frozenset[str]) -> list[tuple[str, str]]:
    """The wanted ``(name, value)`` pairs of a multi-valued mapping with ``getlist``
    (urllib3's ``HTTPHeaderDict``): only the wanted names' values are read (its ``items()``
    joins and copies every header's)."""
    container = getattr(mapping, "_container", None)
    if type(container) is dict:  # urllib3's own: lower-case name -> [name as sent, *values]
        return [
            (entry[0], value)
            for key, entry in container.items()
            if key in wanted
            for value in entry[1:]
        ]
    return [
        (name, value)
        for name in mapping
        if name.lower() in wanted
        for value in mapping.getlist(name)
    ]


def resend_count(value: str | bytes) -> int:
    """The resend count a retry-count request header gives: ``x-stainless-retry-count: N``
    is N; botocore's ``amz-sdk-request: attempt=N; max=M`` is N - 1. 0 when unreadable."""
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    match = _ATTEMPT.search(text)
    try:
        count = int(match.group(1)) - 1 if match else int(text)
    except ValueError:
        return 0
    return max(count, 0)
