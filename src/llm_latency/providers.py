"""The tables every other module reads the provider profiles through
(:mod:`llm_latency.provider_profiles`), and the provider of a request.

Each table gathers one field of every profile, in profile order: the routes that name the spans,
the request-id, server-time, rate-limit, retry-count and usage headers, the stream formats by
content type, the usage fields of response bodies, the keys and types of generated content, and
the response headers captured by default.
"""

from __future__ import annotations

import functools
import re
from typing import Final

from llm_latency.provider_profiles import PROFILES
from llm_latency.provider_schema import RouteFacts


def _unique(names: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


#: Every route, in profile order: the first that matches a path names it.
ROUTES: Final[tuple[tuple[re.Pattern[str], str], ...]] = tuple(
    (re.compile(route.pattern), route.template) for p in PROFILES for route in p.routes
)
#: What each route of :data:`ROUTES` says, in the same order: ``gen_ai.provider.name`` (the
#: provider's where the route is its own, else None) and ``gen_ai.operation.name``.
ROUTE_FACTS: Final[tuple[RouteFacts, ...]] = tuple(
    RouteFacts(p.genai_name if p.own_routes else None, route.operation)
    for p in PROFILES
    for route in p.routes
)
REQUEST_ID_HEADERS: Final = _unique([h for p in PROFILES for h in p.request_id_headers])
SERVER_TIME_HEADERS: Final = tuple(
    dict.fromkeys(item for p in PROFILES for item in p.server_time_headers)
)
RATELIMIT_REMAINING_HEADERS: Final = dict(item for p in PROFILES for item in p.ratelimit_remaining)
#: Reset headers by ``(remaining header's kind, remaining header)``'s family: the reset header
#: of the same provider as the remaining header.
RATELIMIT_RESET_HEADERS: Final = {
    remaining: dict(p.ratelimit_reset).get(kind)
    for p in PROFILES
    for remaining, kind in p.ratelimit_remaining
}
RETRY_COUNT_HEADERS: Final = _unique(
    [p.retry_count_header for p in PROFILES if p.retry_count_header]
)
STREAM_TYPES: Final = dict(item for p in PROFILES for item in p.stream_types)
#: Usage body fields by JSON key. A key two providers share means the same there, except
#: ``input_tokens``: Anthropic's leaves the cached prompt out, which its beside-fields add back.
USAGE_FIELDS: Final = {key: kind for p in PROFILES for key, kind in p.usage_fields}
#: Where a body's usage fields start, any provider's: a usage object's key.
USAGE_AT: Final = _unique([key for p in PROFILES for key in p.usage_at])
USAGE_HEADERS: Final = tuple(dict.fromkeys(item for p in PROFILES for item in p.usage_headers))
SERVER_SPLIT_HEADERS: Final = tuple(
    dict.fromkeys(item for p in PROFILES for item in p.server_split_headers)
)
#: ``gen_ai.provider.name`` by host name.
PROVIDER_HOSTS: Final = tuple(
    (host, p.genai_name) for p in PROFILES if p.genai_name for host in p.hosts
)
#: The JSON keys whose non-empty string value is generated content, any provider's.
CONTENT_KEYS: Final = _unique([key for p in PROFILES for key in p.content_keys])
#: The JSON keys whose non-empty object or list of objects is generated content (a tool call).
CONTENT_OBJECTS: Final = _unique([key for p in PROFILES for key in p.content_objects])
#: The ``"type"`` values of the blocks and items that open generated content (a tool call).
CONTENT_TYPES: Final = _unique([kind for p in PROFILES for kind in p.content_types])
#: The response headers captured by default: all of the above, and the retry hints.
DEFAULT_RESPONSE_HEADERS: Final = _unique(
    [
        *REQUEST_ID_HEADERS,
        *(name for name, _ in SERVER_TIME_HEADERS),
        *(h for p in PROFILES for h in p.extra_headers),
        *(h for h, _ in USAGE_HEADERS),
        *(h for h, _, _ in SERVER_SPLIT_HEADERS),
        *(h for p in PROFILES for h in p.ratelimit_other),
        *RATELIMIT_REMAINING_HEADERS,
        *(h for h in RATELIMIT_RESET_HEADERS.values() if h),
        "retry-after",
        "retry-after-ms",
        "x-should-retry",
    ]
)


def provider_name(host: str, route_owner: str | None) -> str | None:
    """``gen_ai.provider.name`` of a request to ``host``: by the provider's own host, else by
    the owner of its route (:data:`ROUTE_FACTS`); None when neither says (an
    OpenAI-compatible server on a host of its own)."""
    return _host_provider(host) or route_owner


@functools.lru_cache(maxsize=1024)
def _host_provider(host: str) -> str | None:
    """The provider whose own host ``host`` is (a walk over every profile's hosts: kept)."""
    host = host.lower()
    for name, genai_name in PROVIDER_HOSTS:
        if host == name or (name.startswith(".") and host.endswith(name)):
            return genai_name
    return None
