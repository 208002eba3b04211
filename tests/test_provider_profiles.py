"""The provider profiles: each provider's routes name its spans, and its headers are read the
way the provider writes them."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import multidict
import pytest
import requests
from urllib3 import HTTPHeaderDict

from llm_latency import headers
from llm_latency.provider_profiles import PROFILES
from llm_latency.provider_schema import ProviderProfile
from llm_latency.urls import route_template


@pytest.mark.parametrize(
    ("path", "template"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/openai/v1/chat/completions", "/v1/chat/completions"),  # Groq, Azure's v1 API
        (
            "/openai/deployments/gpt-4o/chat/completions",
            "/openai/deployments/{deployment}/chat/completions",
        ),
        ("/v1/messages", "/v1/messages"),
        ("/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse", "/model/{modelId}/converse"),
        ("/model/amazon.nova-lite-v1%3A0/converse-stream", "/model/{modelId}/converse-stream"),
        ("/model/m/invoke", "/model/{modelId}/invoke"),
        ("/model/m/invoke-with-response-stream", "/model/{modelId}/invoke-with-response-stream"),
        (
            "/v1beta/models/gemini-2.5-flash:generateContent",
            "/v1beta/models/{model}:generateContent",
        ),
        (
            "/v1beta/models/gemini-2.5-flash:streamGenerateContent",
            "/v1beta/models/{model}:streamGenerateContent",
        ),
        (
            "/v1/projects/p-1/locations/us-central1/publishers/google/models/gemini-2.5-pro:generateContent",
            "/v1/projects/{project}/locations/{location}/publishers/{publisher}/models/{model}:generateContent",
        ),
        ("/v1/fim/completions", "/v1/fim/completions"),
        ("/v2/chat", "/v2/chat"),
        ("/v1/chat", "/v1/chat"),
        ("/v2/embed", "/v2/embed"),
        ("/api/chat", "/api/chat"),
        ("/api/generate", "/api/generate"),
        ("/generate_stream", "/generate_stream"),
        ("/completion", "/completion"),
        ("/some/other/path", None),
    ],
)
def test_routes_name_spans(path: str, template: str | None) -> None:
    assert route_template(path) == template


def test_every_header_of_every_profile_is_captured_by_default() -> None:
    wanted = set(headers.resolve_capture_list())
    for profile in PROFILES:
        named = {
            *profile.request_id_headers,
            *(name for name, _ in profile.server_time_headers),
            *(name for name, _ in profile.ratelimit_remaining),
            *(name for _, name in profile.ratelimit_reset),
            *profile.ratelimit_other,
            *profile.extra_headers,
        }
        assert named <= wanted, profile.name
        assert not named & headers.SENSITIVE_HEADERS


@pytest.mark.parametrize(
    ("found", "seconds"),
    [
        ({"openai-processing-ms": ["212"]}, 0.212),
        ({"x-amzn-bedrock-invocation-latency": ["1530"]}, 1.53),
        ({"x-envoy-upstream-service-time": ["87"]}, 0.087),
        ({"server-timing": ["gfet4t7; dur=642"]}, 0.642),
        ({"server-timing": ['cdn-cache; desc="MISS", edge;dur=4, origin; dur=250.5']}, 0.2505),
        ({"x-litellm-response-duration-ms": ["1002.4"]}, 1.0024),
        ({"server-timing": ["miss"]}, None),
        ({"openai-processing-ms": ["soon"]}, None),
        ({}, None),
    ],
)
def test_server_time_of_each_provider(found: dict[str, list[str]], seconds: float | None) -> None:
    assert headers.server_time(found) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("value", "count"),
    [
        ("0", 0),
        ("2", 2),
        (b"1", 1),
        ("ttl=20261201T050000Z; attempt=1; max=3", 0),  # botocore's first attempt
        ("attempt=3; max=5", 2),
        ("garbage", 0),
    ],
)
def test_retry_count_headers(value: str | bytes, count: int) -> None:
    assert headers.resend_count(value) == count


@pytest.mark.parametrize(
    "request_headers",
    [
        {"Content-Type": "application/json", "x-stainless-retry-count": "2"},
        requests.structures.CaseInsensitiveDict({"x-stainless-retry-count": "2", "Accept": "*/*"}),
        multidict.CIMultiDict([("Accept", "*/*"), ("X-STAINLESS-RETRY-COUNT", "2")]),
        {"amz-sdk-request": "attempt=3; max=5"},
    ],
    ids=["dict", "requests", "aiohttp", "botocore"],
)
def test_the_resend_count_of_request_headers(request_headers: Any) -> None:
    assert headers.request_resend_count(request_headers) == 2
    assert headers.request_resend_count({"Accept": "*/*"}) == 0


def test_a_multidicts_wanted_headers_every_value_in_order() -> None:
    received = HTTPHeaderDict()
    for name, value in [
        ("Content-Type", "application/json"),
        ("X-Request-Id", "req_1"),
        ("Retry-After", "1"),
        ("x-request-id", "req_2"),
    ]:
        received.add(name, value)
    wanted = frozenset({"x-request-id", "retry-after", "openai-processing-ms"})
    pairs = headers.select_from_multidict(received, wanted)
    assert pairs == [("X-Request-Id", "req_1"), ("X-Request-Id", "req_2"), ("Retry-After", "1")]
    assert headers.select(pairs, wanted) == headers.select(list(received.items()), wanted)

    class OtherMultidict(dict[str, list[str]]):
        """A multi-valued mapping with ``getlist`` and no urllib3 store."""

        def getlist(self, name: str) -> list[str]:
            return self[name]

    other = OtherMultidict({"X-Request-Id": ["req_1", "req_2"], "Retry-After": ["1"]})
    assert headers.select_from_multidict(other, wanted) == pairs


def test_reset_as_duration_or_as_anthropics_timestamp() -> None:
    assert headers.parse_reset("6m0s") == 360.0
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=30)
    left = headers.parse_reset(later.isoformat().replace("+00:00", "Z"))
    assert left is not None and 25 < left <= 30
    assert headers.parse_reset("2001-01-01T00:00:00Z") is None
    assert headers.parse_reset("tomorrow") is None


def tokens(profile: ProviderProfile) -> str:
    """Where a profile's answers say their tokens and the server's split of its time."""
    said = [f"`{key}`" for key, _ in profile.usage_fields]
    said += [f"`{header}`" for header, _ in profile.usage_headers]
    said += [f"`{header}` ({part})" for header, part, _ in profile.server_split_headers]
    return ", ".join(said) or "none"


def providers_table() -> str:
    """docs/providers.md's table, as the profiles give it."""

    def names(items: Iterable[str]) -> str:
        return ", ".join(f"`{item}`" for item in items) or "none"

    rows = [
        "| provider | routes (span names) | request id | server time | rate limits | retry count | streams | tokens and the server's split |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in PROFILES:
        routes = sorted({route.template.replace("\\1", "{version}") for route in p.routes})
        shown = names(routes) if len(routes) <= 6 else names(routes[:6]) + ", ..."
        if p.note:
            shown = p.note if not routes else f"{shown}; {p.note}"
        rows.append(
            "| "
            + " | ".join(
                [
                    p.name,
                    shown,
                    names(p.request_id_headers),
                    names(name for name, _ in p.server_time_headers),
                    names(name for name, _ in p.ratelimit_remaining),
                    names([p.retry_count_header] if p.retry_count_header else []),
                    names(dict.fromkeys(kind for _, kind in p.stream_types)),
                    tokens(p),
                ]
            )
            + " |"
        )
    return "\n".join(rows) + "\n"


def test_the_docs_list_every_profile_as_the_code_has_it() -> None:
    readme = (Path(__file__).parent.parent / "docs" / "providers.md").read_text()
    assert providers_table() in readme, "regenerate: python tests/test_provider_profiles.py"


if __name__ == "__main__":
    print(providers_table(), end="")
