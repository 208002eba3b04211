"""The mock server speaks each API as its real SDK reads it: the ``openai``, ``anthropic`` and
``ollama`` clients against ``running(Profile(...))`` on loopback see the finish reason, the
usage, the stop reason, Ollama's done line, the request id headers, the latency profile (lower
bounds only) and the scripted 429s and 500s, retried by the SDK's own retries where it has them.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
from anthropic.types import MessageParam, RawMessageDeltaEvent
from openai.types.chat import ChatCompletionMessageParam

from llm_latency.testing import Profile, RunningServer, running

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]
#: The same conversation for the anthropic and ollama clients' types.
CLAUDE_MESSAGES: list[MessageParam] = [{"role": "user", "content": "Say hello."}]
OLLAMA_MESSAGES: list[Mapping[str, Any]] = [{"role": "user", "content": "Say hello."}]
TOKENS = 5
#: "Say hello.": the mock counts a prompt's words as its tokens.
PROMPT = 2
EXPECTED = "".join(f"token{i} " for i in range(TOKENS))
EARLY = 0.005  # a timer may fire this much before its deadline (the bounds are lower bounds)


@pytest.fixture
async def server() -> AsyncIterator[RunningServer]:
    async with running(Profile(ttfb=0.05, tokens=TOKENS, tokens_per_second=200)) as mock:
        yield mock


def openai_client(server: RunningServer, max_retries: int = 2) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=server.url("/v1"), api_key="sk-mock", max_retries=max_retries
    )


def anthropic_client(server: RunningServer, max_retries: int = 2) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=server.url(""), api_key="sk-ant-mock", max_retries=max_retries
    )


# -- OpenAI ----------------------------------------------------------------------------------------


async def test_openai_stream_ends_with_finish_reason_and_usage(server: RunningServer) -> None:
    async with openai_client(server) as client:
        stream = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        assert stream.response.headers["x-request-id"].startswith("req_")
        assert int(stream.response.headers["openai-processing-ms"]) >= 50 - 5
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == EXPECTED
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {c.model for c in chunks} == {"gpt-4o-mini"}
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish == [None] * TOKENS + ["stop"]
    *before, last = chunks
    assert last.choices == [] and last.usage is not None  # the usage chunk comes last
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (PROMPT, TOKENS)
    assert last.usage.total_tokens == PROMPT + TOKENS
    assert all(c.usage is None for c in before)


async def test_openai_stream_without_include_usage_has_no_usage_chunk(
    server: RunningServer,
) -> None:
    async with openai_client(server) as client:
        stream = await client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            stream=True,
        )
        chunks = [chunk async for chunk in stream]
    assert all(len(c.choices) == 1 and c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].choices[0].delta.content is None


async def test_openai_stream_ends_with_done_on_the_wire(server: RunningServer) -> None:
    """The raw events: JSON chunks, the finish chunk, the usage chunk, then ``[DONE]``."""
    options = {"include_usage": True}
    body = {"model": "m", "messages": MESSAGES, "stream": True, "stream_options": options}
    async with httpx.AsyncClient() as client:
        response = await client.post(server.url(), json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [e.removeprefix("data: ") for e in response.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    finish, usage = json.loads(events[-3]), json.loads(events[-2])
    assert finish["choices"][0] == {"index": 0, "delta": {}, "logprobs": None,
                                    "finish_reason": "stop"}  # fmt: skip
    assert usage["object"] == "chat.completion.chunk" and usage["choices"] == []
    assert len(events) == TOKENS + 3


async def test_openai_json_answer_has_finish_reason_usage_and_request_id(
    server: RunningServer,
) -> None:
    async with openai_client(server) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini",
            messages=MESSAGES,
        )
        completion = raw.parse()
    assert raw.headers["x-request-id"] == completion._request_id
    assert completion._request_id is not None and completion._request_id.startswith("req_")
    # The whole answer (5 tokens at 200/s) is generated before the headers.
    assert int(raw.headers["openai-processing-ms"]) >= 50 + 25 - 5
    assert raw.headers["x-ratelimit-limit-requests"] == "500"
    (choice,) = completion.choices
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant" and choice.message.content == EXPECTED
    assert completion.usage is not None and completion.usage.completion_tokens == TOKENS


async def test_openai_sdk_retries_the_scripted_429() -> None:
    async with running(Profile(ttfb=0.01, tokens=2, retry_after_ms=300)) as server:
        server.state.rate_limit_next = 1
        async with openai_client(server) as client:
            started = time.monotonic()
            raw = await client.chat.completions.with_raw_response.create(
                model="m",
                messages=MESSAGES,
            )
            waited = time.monotonic() - started
    assert raw.retries_taken == 1
    assert raw.parse().choices[0].finish_reason == "stop"
    assert waited >= 0.3 - EARLY  # the SDK waited retry-after-ms


async def test_openai_sdk_sees_the_429_and_500_with_their_headers() -> None:
    async with running(Profile(ttfb=0.01, tokens=1, retry_after_ms=1500)) as server:
        server.state.rate_limit_next = 1
        async with openai_client(server, max_retries=0) as client:
            with pytest.raises(openai.RateLimitError) as limited:
                await client.chat.completions.create(model="m", messages=MESSAGES)
    assert limited.value.status_code == 429
    assert limited.value.response.headers["retry-after-ms"] == "1500"
    assert limited.value.response.headers["retry-after"] == "2"
    assert limited.value.request_id is not None and limited.value.request_id.startswith("req_")
    assert limited.value.code == "rate_limit_exceeded"
    async with running(Profile(ttfb=0.01, tokens=1, error_rate=1.0, seed=1)) as server:
        async with openai_client(server, max_retries=0) as client:
            with pytest.raises(openai.InternalServerError) as failed:
                await client.chat.completions.create(model="m", messages=MESSAGES)
    assert failed.value.status_code == 500 and failed.value.request_id is not None


async def test_models_and_unknown_paths(server: RunningServer) -> None:
    async with openai_client(server) as client:
        models = [m.id async for m in client.models.list()]
        with pytest.raises(openai.NotFoundError) as missing:
            await client.completions.create(model="m", prompt="hi")
    assert models == ["mock-gpt"]
    assert missing.value.status_code == 404
    assert missing.value.body == {"message": "Invalid URL (POST /v1/completions)",
                                  "type": "invalid_request_error", "param": None,
                                  "code": None}  # fmt: skip
    async with anthropic_client(server) as client:
        claude = [m.id async for m in client.models.list()]
    assert claude == ["mock-claude"]
    async with httpx.AsyncClient() as raw:
        wrong_method = await raw.get(server.url("/v1/chat/completions"))
    assert wrong_method.status_code == 404
    assert wrong_method.json()["error"]["message"] == "Invalid URL (GET /v1/chat/completions)"


# -- Anthropic -------------------------------------------------------------------------------------


async def test_anthropic_create_has_stop_reason_usage_and_request_id(
    server: RunningServer,
) -> None:
    async with anthropic_client(server) as client:
        raw = await client.messages.with_raw_response.create(
            model="mock-claude-sonnet",
            max_tokens=64,
            messages=CLAUDE_MESSAGES,
        )
        message = await raw.parse()
    assert message._request_id == raw.headers["request-id"]
    assert message._request_id is not None and message._request_id.startswith("req_")
    assert "x-request-id" not in raw.headers and "openai-processing-ms" not in raw.headers
    for kind in ("requests", "tokens", "input-tokens", "output-tokens"):
        for what in ("limit", "remaining", "reset"):
            assert raw.headers[f"anthropic-ratelimit-{kind}-{what}"]
    assert raw.headers["anthropic-ratelimit-requests-remaining"] == "499"
    assert raw.headers["anthropic-ratelimit-requests-reset"].endswith("Z")
    assert message.model == "mock-claude-sonnet"
    assert message.stop_reason == "end_turn"
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == EXPECTED  # type: ignore[union-attr]
    assert (message.usage.input_tokens, message.usage.output_tokens) == (PROMPT, TOKENS)


async def test_anthropic_stream_events_reach_the_sdk(server: RunningServer) -> None:
    async with anthropic_client(server) as client:
        stream = await client.messages.create(
            model="mock-claude-sonnet",
            max_tokens=64,
            messages=CLAUDE_MESSAGES,
            stream=True,
        )
        assert stream.response.headers["request-id"].startswith("req_")
        events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert kinds == ["message_start", "content_block_start", *["content_block_delta"] * TOKENS,
                     "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    delta = events[-2]
    assert isinstance(delta, RawMessageDeltaEvent)
    assert delta.delta.stop_reason == "end_turn" and delta.usage.output_tokens == TOKENS


async def test_anthropic_messages_stream_helper_builds_the_final_message() -> None:
    async with (
        running(Profile(ttfb=0.2, tokens=TOKENS, tokens_per_second=100)) as server,
        anthropic_client(server) as client,
    ):
        started = time.monotonic()
        async with client.messages.stream(
            model="mock-claude-haiku",
            max_tokens=64,
            messages=CLAUDE_MESSAGES,
        ) as stream:
            texts = [text async for text in stream.text_stream]
            first_text = texts[0]
            final = await stream.get_final_message()
            request_id = stream.response.headers["request-id"]
        elapsed = time.monotonic() - started
    assert first_text == "token0 " and "".join(texts) == EXPECTED
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == TOKENS and final.usage.input_tokens == PROMPT
    assert request_id.startswith("req_")
    assert elapsed >= 0.2 + 4 * 0.01 - EARLY  # the time to the first byte, then four gaps


async def test_anthropic_sdk_retries_the_scripted_429_after_retry_after() -> None:
    async with running(Profile(ttfb=0.01, tokens=2, retry_after_ms=1000)) as server:
        server.state.rate_limit_next = 1
        async with anthropic_client(server) as client:
            started = time.monotonic()
            raw = await client.messages.with_raw_response.create(
                model="mock-claude-haiku",
                max_tokens=16,
                messages=CLAUDE_MESSAGES,
            )
            waited = time.monotonic() - started
    assert raw.retries_taken == 1 and (await raw.parse()).stop_reason == "end_turn"
    assert waited >= 1.0 - EARLY  # retry-after: 1 (whole seconds, as Anthropic sends it)


async def test_anthropic_sdk_sees_the_429_and_500_in_anthropic_shape() -> None:
    async with running(Profile(ttfb=0.01, tokens=1, retry_after_ms=2000)) as server:
        server.state.rate_limit_next = 1
        async with anthropic_client(server, max_retries=0) as client:
            with pytest.raises(anthropic.RateLimitError) as limited:
                await client.messages.create(model="m", max_tokens=8, messages=CLAUDE_MESSAGES)
    headers = limited.value.response.headers
    assert headers["retry-after"] == "2" and "retry-after-ms" not in headers
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert limited.value.request_id == headers["request-id"]
    assert isinstance(limited.value.body, dict)
    assert limited.value.body["error"]["type"] == "rate_limit_error"
    async with running(Profile(ttfb=0.01, tokens=1, error_rate=1.0, seed=1)) as server:
        async with anthropic_client(server, max_retries=0) as client:
            with pytest.raises(anthropic.InternalServerError) as failed:
                await client.messages.create(model="m", max_tokens=8, messages=CLAUDE_MESSAGES)
    assert failed.value.status_code == 500 and failed.value.request_id is not None
    assert isinstance(failed.value.body, dict) and failed.value.body["error"]["type"] == "api_error"


# -- Ollama ----------------------------------------------------------------------------------------


async def test_ollama_chat_stream_ends_with_the_done_line(server: RunningServer) -> None:
    client = ollama.AsyncClient(host=server.url(""))
    parts = [part async for part in await client.chat(model="llama3.2", messages=OLLAMA_MESSAGES,
                                                      stream=True)]  # fmt: skip
    *tokens, last = parts
    assert len(tokens) == TOKENS and not any(part.done for part in tokens)
    assert "".join(part.message.content or "" for part in parts) == EXPECTED
    assert all(part.message.role == "assistant" and part.model == "llama3.2" for part in parts)
    assert last.done and last.done_reason == "stop"
    assert (last.prompt_eval_count, last.eval_count) == (PROMPT, TOKENS)
    assert last.total_duration is not None and last.eval_duration is not None
    assert last.total_duration >= (0.05 + 4 * 0.005 - EARLY) * 1e9  # measured, in nanoseconds
    assert last.total_duration >= last.eval_duration + (last.prompt_eval_duration or 0)


async def test_ollama_generate_streamed_and_not(server: RunningServer) -> None:
    client = ollama.AsyncClient(host=server.url(""))
    whole = await client.generate(model="llama3.2", prompt="Say hello.", stream=False)
    assert whole.done and whole.done_reason == "stop" and whole.response == EXPECTED
    assert whole.eval_count == TOKENS and whole.context
    assert whole.total_duration is not None and whole.total_duration >= (0.05 + 0.025 - EARLY) * 1e9
    parts = [p async for p in await client.generate(model="llama3.2", prompt="Hi", stream=True)]
    assert "".join(p.response or "" for p in parts) == EXPECTED
    assert [p.done for p in parts] == [False] * TOKENS + [True]
    assert parts[-1].done_reason == "stop" and parts[-1].eval_count == TOKENS
    listed = await client.list()
    assert [m.model for m in listed.models] == ["mock-llama:latest"]


async def test_ollama_chat_not_streamed(server: RunningServer) -> None:
    client = ollama.AsyncClient(host=server.url(""))
    answer = await client.chat(model="llama3.2", messages=OLLAMA_MESSAGES, stream=False)
    assert answer.done and answer.done_reason == "stop"
    assert answer.message.role == "assistant" and answer.message.content == EXPECTED
    assert answer.eval_count == TOKENS


async def test_ollama_wire_format_has_ndjson_and_no_request_id(server: RunningServer) -> None:
    """Ollama streams unless told not to (no ``stream`` field streams), one JSON object a line,
    and sends no request id and no rate-limit headers."""
    async with httpx.AsyncClient() as client:
        response = await client.post(server.url("/api/chat"), json={"model": "m"})
    assert response.headers["content-type"] == "application/x-ndjson"
    assert not any("request-id" in name or "ratelimit" in name for name in response.headers)
    lines = response.text.splitlines()
    assert response.text.endswith("\n") and len(lines) == TOKENS + 1
    last = json.loads(lines[-1])
    assert last["done"] is True and last["message"] == {"role": "assistant", "content": ""}
    assert {"total_duration", "load_duration", "prompt_eval_duration", "eval_duration"} <= set(last)


async def test_ollama_client_sees_the_scripted_failures() -> None:
    async with running(Profile(ttfb=0.01, tokens=1)) as server:
        server.state.rate_limit_next = 1
        client = ollama.AsyncClient(host=server.url(""))
        with pytest.raises(ollama.ResponseError) as limited:
            await client.chat(model="m", messages=OLLAMA_MESSAGES)
        after = await client.chat(model="m", messages=OLLAMA_MESSAGES)
    assert limited.value.status_code == 429 and "rate limit" in limited.value.error
    assert after.done
    async with running(Profile(ttfb=0.01, tokens=1, error_rate=1.0, seed=1)) as server:
        client = ollama.AsyncClient(host=server.url(""))
        with pytest.raises(ollama.ResponseError) as failed:
            await client.generate(model="m", prompt="hi")
    assert failed.value.status_code == 500


async def test_all_routes_share_one_profile_and_counter() -> None:
    """Every third request is rate limited, whichever API it speaks."""
    async with running(Profile(ttfb=0.01, tokens=1, rate_limit_every=3)) as server:
        async with httpx.AsyncClient() as client:
            statuses = [
                (await client.post(server.url(path), json=body)).status_code
                for path, body in [
                    ("/v1/chat/completions", {"model": "m"}),
                    ("/v1/messages", {"model": "m"}),
                    ("/api/chat", {"model": "m", "stream": False}),
                    ("/api/generate", {"model": "m", "stream": False}),
                    ("/v1/messages", {"model": "m"}),
                    ("/v1/chat/completions", {"model": "m"}),
                ]
            ]
    assert statuses == [200, 200, 429, 200, 200, 429]
