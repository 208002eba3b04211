"""The time to first token of a retried call: the call's span measures it from the call's start
(what the program waited: the failed attempt and the backoff included), each attempt's span from
the attempt's own start. The real openai SDK retries a 429 inside one call, against a loopback
provider."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from tests.conftest import Telemetry
from tests.provider_api import TOKEN_GAP, ProviderServer, provider_server

TTFT = "llm_latency.time_to_first_token"


@pytest.fixture
async def provider() -> AsyncIterator[ProviderServer]:
    async with provider_server() as server:
        yield server


def _first_token_after(provider: ProviderServer, is_async: bool) -> Any:
    """A streamed chat completion whose first attempt is a 429 (retried by the SDK after the
    150 ms the server asks for): the seconds from the call to its first token, as the program
    sees them (a coroutine for the async client). A call before it, not retried, warms the SDK
    up (its first call builds what it caches before it reaches the HTTP request)."""
    headers = {"x-test-scenario": f"ttft-{is_async}", "x-test-fail": "1"}
    kwargs: dict[str, Any] = {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }
    if is_async:
        client = openai.AsyncOpenAI(base_url=provider.openai_base, api_key="sk-t", max_retries=2)

        async def measure() -> float:
            async for _ in await client.chat.completions.create(**kwargs):
                pass
            kwargs["extra_headers"] = headers
            start = time.perf_counter()
            first = None
            async for chunk in await client.chat.completions.create(**kwargs):
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter() - start
            assert first is not None
            return first

        return measure()
    sync = openai.OpenAI(base_url=provider.openai_base, api_key="sk-t", max_retries=2)
    for _ in sync.chat.completions.create(**kwargs):
        pass
    kwargs["extra_headers"] = headers
    start = time.perf_counter()
    first = None
    for chunk in sync.chat.completions.create(**kwargs):
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - start
    assert first is not None
    return first


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_a_retried_call_measures_its_first_token_from_its_start(
    telemetry: Telemetry, provider: ProviderServer, is_async: bool
) -> None:
    if is_async:
        waited = await _first_token_after(provider, is_async)
    else:
        waited = await asyncio.to_thread(_first_token_after, provider, is_async)
    spans = telemetry.spans()
    calls = [s for s in spans if s.kind is SpanKind.INTERNAL and s.name.startswith("openai")]
    warm, call = sorted(calls, key=lambda s: s.start_time or 0)
    assert _attr(call, "llm_latency.attempts") == 2
    attempts = sorted(
        (s for s in spans if s.kind is SpanKind.CLIENT and s.parent is not None
         and s.parent.span_id == call.context.span_id),
        key=lambda s: s.start_time or 0,
    )  # fmt: skip
    assert len(attempts) == 2 and _attr(attempts[0], "http.response.status_code") == 429
    answered = attempts[1]
    call_ttft, attempt_ttft = _attr(call, TTFT), _attr(answered, TTFT)
    # The call's from its start: what the program waited, to the resolution of the chunks (the
    # span opens after the program's clock starts, the SDK hands the chunk over after it
    # arrived); the 429 and the 150 ms backoff are in it.
    assert call_ttft <= waited
    assert waited - call_ttft < TOKEN_GAP, (waited, call_ttft, attempt_ttft)
    # The attempt's from its own start: the same instant, seen from later.
    since_call = ((answered.start_time or 0) - (call.start_time or 0)) / 1e9
    assert since_call >= 0.15
    assert abs(attempt_ttft + since_call - call_ttft) < 1e-3
    # A call of one attempt: the SDK's own steps before its attempt are the call's too.
    (only,) = [s for s in spans if s.parent and s.parent.span_id == warm.context.span_id]
    since_call = ((only.start_time or 0) - (warm.start_time or 0)) / 1e9
    assert abs(_attr(only, TTFT) + since_call - _attr(warm, TTFT)) < 1e-3


def _attr(span: ReadableSpan, name: str) -> Any:
    assert span.attributes is not None and name in span.attributes, (span.name, name)
    return span.attributes[name]
