"""URL redaction and route templates."""

from __future__ import annotations

import pytest

from llm_latency.urls import proxy_origin, redact, route_template, scrub_userinfo


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://u:p@api.example/v1/x?key=s&model=m", "https://REDACTED:REDACTED@api.example/v1/x?key=REDACTED&model=m"),
        ("https://api.example/v1/x?API_KEY=s&sig=t#frag", "https://api.example/v1/x?API_KEY=REDACTED&sig=REDACTED"),
        ("https://api.example/v1/x?token=s&api-key=t", "https://api.example/v1/x?token=REDACTED&api-key=REDACTED"),
        ("https://api.example/v1/chat/completions", "https://api.example/v1/chat/completions"),
        ("http://[::1]:8080/v1/models?limit=5", "http://[::1]:8080/v1/models?limit=5"),
    ],
)  # fmt: skip
def test_redact(url: str, expected: str) -> None:
    assert redact(url) == expected


@pytest.mark.parametrize(
    ("path", "template"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/openai/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/messages", "/v1/messages"),
        ("/v1/responses/resp_123", "/v1/responses/{response_id}"),
        ("/v1/embeddings/", "/v1/embeddings"),
        ("/openai/deployments/gpt4o/chat/completions", "/openai/deployments/{deployment}/chat/completions"),
        ("/v1/chat/completionsX", None),
        ("/health", None),
    ],
)  # fmt: skip
def test_route_template(path: str, template: str | None) -> None:
    assert route_template(path) == template


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://user:s3cret@proxy.corp:3128", "http://proxy.corp:3128"),
        ("http://user:s3cret@proxy.corp:3128/some/path?x=1", "http://proxy.corp:3128"),
        ("https://[::1]:8443", "https://[::1]:8443"),
        ("proxy.corp:3128", "http://proxy.corp:3128"),
        ("http://proxy.corp", "http://proxy.corp"),
        ("http://:3128", "REDACTED"),
    ],
)  # fmt: skip
def test_proxy_origin_has_no_credentials(url: str, expected: str) -> None:
    assert proxy_origin(url) == expected


def test_scrub_userinfo_in_exception_text() -> None:
    text = "401, message='Unauthorized', url='http://llm-user:pw@127.0.0.2:3128' (see https://x.test/a@b)"
    assert scrub_userinfo(text) == (
        "401, message='Unauthorized', url='http://REDACTED:REDACTED@127.0.0.2:3128' "
        "(see https://x.test/a@b)"
    )
