"""Secrets, for the httpx family (aiohttp, requests and the SDKs have their own tests): a secret
in every place never reaches a span, an event or a metric; asking to capture a credential
header is refused with a warning."""

from __future__ import annotations

import logging

import pytest

import llm_latency
from llm_latency import emitter as emitting
from tests.attributes import str_attr
from tests.conftest import Telemetry
from tests.httpx_clients import KINDS, Client
from tests.servers import SECRET_RESPONSE_BODY, LLMServer

SECRETS = {
    "authorization": "sk-authorization-secret-a1",
    "api-key": "api-key-secret-b2",
    "x-api-key": "x-api-key-secret-c3",
    "cookie": "cookie-secret-d4",
    "password": "url-password-secret-e5",
    "query": "query-secret-f6",
    "body": "request-body-secret-g7",
}


def exported(telemetry: Telemetry) -> str:
    data = telemetry.reader.get_metrics_data()
    return "".join(s.to_json() for s in telemetry.spans()) + (data.to_json() if data else "")


@pytest.mark.parametrize("kind", KINDS)
async def test_no_secret_is_exported(telemetry: Telemetry, server: LLMServer, kind: str) -> None:
    headers = {"Authorization": f"Bearer {SECRETS['authorization']}",
               "api-key": SECRETS["api-key"], "x-api-key": SECRETS["x-api-key"],
               "Cookie": f"session={SECRETS['cookie']}"}  # fmt: skip
    query = "&".join(f"{name}={SECRETS['query']}" for name in ("key", "api_key", "token", "sig"))
    url = f"http://user:{SECRETS['password']}@127.0.0.1:{server.port}/v1/chat/completions?{query}"
    async with Client(kind) as client:
        for extra in ("", "&chunks=3&sse=1"):
            result = await client.request(
                "POST", url + extra, headers=headers, json={"content": SECRETS["body"]}
            )
            assert result.status == 200
    text = exported(telemetry)
    assert len(telemetry.requests()) == 2
    for secret in (*SECRETS.values(), SECRET_RESPONSE_BODY, "cookie-secret-9c1d"):
        assert secret not in text
    url_full = str_attr(telemetry.requests()[0], "url.full")
    assert "key=REDACTED" in url_full
    assert "/v1/chat/completions" in url_full


def test_capturing_credential_headers_is_refused(
    telemetry: Telemetry, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm_latency.uninstrument()
    monkeypatch.setenv("OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_RESPONSE", "Set-Cookie")
    with caplog.at_level(logging.WARNING, logger="llm_latency"):
        telemetry.instrument(capture_response_headers=["authorization", "x-api-key", "x-fine"])
    refused = {r.getMessage().split("'")[1] for r in caplog.records if "refusing" in r.getMessage()}
    assert refused == {"authorization", "x-api-key", "set-cookie"}
    emitter = emitting.active
    assert emitter is not None
    assert "x-fine" in emitter.captured_headers
    assert not {"authorization", "x-api-key", "set-cookie"} & emitter.captured_headers
