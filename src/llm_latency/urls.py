"""URL facts for spans: redacted ``url.full`` and the ``url.template`` of known LLM routes."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from opentelemetry.util.http import PARAMS_TO_REDACT, remove_url_credentials

from llm_latency.provider_schema import RouteFacts
from llm_latency.providers import ROUTE_FACTS, ROUTES

REDACTED: Final = "REDACTED"

#: Query parameters whose values are secrets (compared case-insensitively).
SECRET_QUERY_PARAMS: Final = frozenset(
    name.lower()
    for name in (
        *PARAMS_TO_REDACT,
        "key",
        "api_key",
        "api-key",
        "apikey",
        "access_token",
        "token",
        "auth",
        "password",
        "secret",
        "client_secret",
        "code",
        "credential",
        "x-amz-signature",
        "x-amz-credential",
        "x-amz-security-token",
    )
)


@lru_cache(maxsize=512)
def route_template(path: str) -> str | None:
    """The ``url.template`` of a route of a known provider (:mod:`llm_latency.providers`), or
    None."""
    return route(path)[0]


def route(path: str) -> tuple[str | None, RouteFacts | None]:
    """The ``url.template`` of a known provider's route (None when none matches), and what the
    route says of the attempt: the provider that alone serves it, its operation."""
    for (pattern, template), facts in zip(ROUTES, ROUTE_FACTS, strict=True):
        match = pattern.search(path)
        if match:
            return (match.expand(template) if "\\" in template else template), facts
    return None, None


def _redact_query(query: str) -> str:
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(name.lower() in SECRET_QUERY_PARAMS for name, _ in pairs):
        return query
    return urlencode(
        [
            (name, REDACTED if name.lower() in SECRET_QUERY_PARAMS else value)
            for name, value in pairs
        ],
        safe=REDACTED,
    )


@lru_cache(maxsize=1024)
def redact(url: str) -> str:
    """``url`` without user info (``REDACTED:REDACTED@``), secret query values or fragment."""
    url = remove_url_credentials(url)
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    query = _redact_query(parts.query) if parts.query else ""
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))


@lru_cache(maxsize=64)
def proxy_origin(url: str) -> str:
    """A proxy's ``scheme://host:port``, with no credentials, path or query (a proxy URL can
    carry a user and password; they never reach a span)."""
    try:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        host, port = parts.hostname, parts.port
    except ValueError:
        return REDACTED
    if not host:
        return REDACTED
    netloc = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{netloc}" + ("" if port is None else f":{port}")


_USERINFO = re.compile(r"(?<=//)[^/@\s'\"]+@")


def scrub_userinfo(text: str) -> str:
    """``text`` with the ``user:password@`` of any URL in it redacted: exception messages can
    quote a URL whole (aiohttp's proxy errors quote the proxy's, credentials and all)."""
    return _USERINFO.sub(f"{REDACTED}:{REDACTED}@", text)
