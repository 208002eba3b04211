"""URL facts for spans: redacted ``url.full`` and the ``url.template`` of known LLM routes."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from opentelemetry.util.http import PARAMS_TO_REDACT, remove_url_credentials

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

# Known LLM API routes: a pattern on the path and the template reported for it. A leading
# prefix (a gateway's base path such as "/openai") is allowed before "/v1".
_ROUTES: Final[tuple[tuple[re.Pattern[str], str], ...]] = tuple(
    (re.compile(pattern), template)
    for pattern, template in (
        (r"(?:^|/)v1/chat/completions/?$", "/v1/chat/completions"),
        (r"(?:^|/)v1/completions/?$", "/v1/completions"),
        (r"(?:^|/)v1/responses/?$", "/v1/responses"),
        (r"(?:^|/)v1/responses/[^/]+/?$", "/v1/responses/{response_id}"),
        (r"(?:^|/)v1/messages/?$", "/v1/messages"),
        (r"(?:^|/)v1/messages/count_tokens/?$", "/v1/messages/count_tokens"),
        (r"(?:^|/)v1/messages/batches/?$", "/v1/messages/batches"),
        (r"(?:^|/)v1/complete/?$", "/v1/complete"),
        (r"(?:^|/)v1/embeddings/?$", "/v1/embeddings"),
        (r"(?:^|/)v1/moderations/?$", "/v1/moderations"),
        (r"(?:^|/)v1/models/?$", "/v1/models"),
        (r"(?:^|/)v1/audio/transcriptions/?$", "/v1/audio/transcriptions"),
        (r"(?:^|/)v1/audio/speech/?$", "/v1/audio/speech"),
        (r"(?:^|/)v1/images/generations/?$", "/v1/images/generations"),
        (r"(?:^|/)v1/batches/?$", "/v1/batches"),
        (
            r"(?:^|/)openai/deployments/[^/]+/chat/completions/?$",
            "/openai/deployments/{deployment}/chat/completions",
        ),
        (
            r"(?:^|/)openai/deployments/[^/]+/embeddings/?$",
            "/openai/deployments/{deployment}/embeddings",
        ),
        (r"(?:^|/)api/chat/?$", "/api/chat"),
        (r"(?:^|/)api/generate/?$", "/api/generate"),
    )
)


@lru_cache(maxsize=512)
def route_template(path: str) -> str | None:
    """The ``url.template`` of a known LLM route, or None."""
    for pattern, template in _ROUTES:
        if pattern.search(path):
            return template
    return None


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
