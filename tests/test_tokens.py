"""The server's share, end to end: real SDKs and plain clients against the mock model server
(prefill per prompt token, a paced decode, ``max_tokens`` honoured, limited slots). Token counts
are checked against the mock's own (what the program's SDK got), times to first token and per
output token against the same stream as the test itself received it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import fields
from typing import Any

import aiohttp
import anthropic
import httpx
import ollama
import openai
import pytest
import requests
from opentelemetry.sdk.trace import ReadableSpan

from llm_latency.attribute_table import USAGE_ATTRIBUTES
from llm_latency.testing import Profile, RunningServer, running
from llm_latency.usage import Usage
from tests.checks import EARLY
from tests.conftest import Telemetry

PROMPT = "one two three four five six"  # the mock counts words: 6 prompt tokens
PROMPT_TOKENS = 6
MAX_TOKENS = 8  # below the profile's 20: the request's limit is what the server generates
TTFB = 0.05
PREFILL_PER_TOKEN = 0.002
GAP = 0.05  # between two tokens: 20 tokens per second
#: How far apart two readings of one chunk's arrival may be: the chunk interval.
RESOLUTION = GAP
#: A reading of perf_counter against one of time_ns, for the same instant.
CLOCKS = 0.002
MESSAGES: list[Any] = [{"role": "user", "content": PROMPT}]


@pytest.fixture
async def server() -> AsyncIterator[RunningServer]:
    profile = Profile(
        ttfb=TTFB, tokens=20, tokens_per_second=1 / GAP, prefill_per_token=PREFILL_PER_TOKEN
    )
    async with running(profile) as mock:
        yield mock


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def the_attempt(telemetry: Telemetry) -> dict[str, Any]:
    (request,) = telemetry.requests()
    return attrs(request)


def assert_times_agree(span: ReadableSpan, arrivals: list[int], output: int) -> None:
    """The span's time to first token and time per output token against the test's own
    readings (``time.time_ns()`` as each content chunk reached the program): the program reads
    a chunk after llm-latency saw its bytes, within one chunk interval."""
    found = attrs(span)
    assert span.start_time is not None
    reference_ttft = (arrivals[0] - span.start_time) / 1e9
    ttft = found["llm_latency.time_to_first_token"]
    assert -CLOCKS <= reference_ttft - ttft <= RESOLUTION, (reference_ttft, ttft)
    assert ttft >= TTFB + PREFILL_PER_TOKEN * PROMPT_TOKENS - EARLY
    reference_tpot = (arrivals[-1] - arrivals[0]) / 1e9 / (output - 1)
    tpot = found["llm_latency.time_per_output_token"]
    assert abs(tpot - reference_tpot) * (output - 1) <= RESOLUTION, (tpot, reference_tpot)
    # The server paced its tokens GAP apart; the first one may be seen up to a chunk late.
    assert tpot * (output - 1) >= (output - 1) * GAP - RESOLUTION


# -- the SDKs --------------------------------------------------------------------------------


@pytest.mark.parametrize("include_usage", [True, False], ids=["include_usage", "no usage"])
async def test_openai_stream(
    telemetry: Telemetry, server: RunningServer, include_usage: bool
) -> None:
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="sk-test")
    options: dict[str, Any] = {"stream_options": {"include_usage": True}} if include_usage else {}

    def read() -> tuple[list[int], Any]:
        arrivals, usage = [], None
        stream = client.chat.completions.create(
            model="gpt-test", messages=MESSAGES, max_tokens=MAX_TOKENS, stream=True, **options
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append(time.time_ns())
            usage = chunk.usage or usage
        return arrivals, usage

    arrivals, usage = await asyncio.to_thread(read)
    assert len(arrivals) == MAX_TOKENS
    (request,) = telemetry.requests()
    found = attrs(request)
    (call,) = [s for s in telemetry.spans() if s.name == "openai chat.completions"]
    if include_usage:
        assert (usage.prompt_tokens, usage.completion_tokens) == (PROMPT_TOKENS, MAX_TOKENS)
        for span in (request, call):
            assert attrs(span)["gen_ai.usage.input_tokens"] == usage.prompt_tokens
            assert attrs(span)["gen_ai.usage.output_tokens"] == usage.completion_tokens
            assert "llm_latency.usage.unknown" not in attrs(span)
        assert_times_agree(request, arrivals, MAX_TOKENS)
    else:
        # Nothing invented: no count, no time per token; the first token is still seen.
        assert usage is None
        assert found["llm_latency.usage.unknown"] is True
        assert not [name for name in found if name.startswith("gen_ai.usage.")]
        assert "llm_latency.time_per_output_token" not in found
        assert found["llm_latency.time_to_first_token"] > 0
    assert found["gen_ai.response.model"] == "gpt-test"
    # The first chunk (the role and the first word, in the mock) is the first token here;
    # time to first chunk stays as it was, beside it.
    assert found["gen_ai.response.time_to_first_chunk"] <= found["llm_latency.time_to_first_token"]


async def test_anthropic_stream_takes_the_last_cumulative_usage(
    telemetry: Telemetry, server: RunningServer
) -> None:
    client = anthropic.AsyncAnthropic(base_url=server.url(""), api_key="sk-ant-test")
    arrivals: list[int] = []
    async with client.messages.stream(
        model="claude-test", max_tokens=MAX_TOKENS, messages=MESSAGES
    ) as stream:
        async for text in stream.text_stream:
            if text:
                arrivals.append(time.time_ns())
        message = await stream.get_final_message()
    await client.close()
    assert (message.usage.input_tokens, message.usage.output_tokens) == (PROMPT_TOKENS, MAX_TOKENS)
    (request,) = telemetry.requests()
    found = attrs(request)
    # message_start says 1 output token, message_delta the cumulative 8: 8, never 9.
    assert found["gen_ai.usage.input_tokens"] == PROMPT_TOKENS
    assert found["gen_ai.usage.output_tokens"] == MAX_TOKENS
    # The stream's cache reads are 0: left out, as a count that says nothing
    assert "gen_ai.usage.cache_read.input_tokens" not in found
    assert found["gen_ai.provider.name"] == "anthropic"
    assert_times_agree(request, arrivals, MAX_TOKENS)


async def test_ollama_reports_its_own_prefill_and_decode(
    telemetry: Telemetry, server: RunningServer
) -> None:
    client = ollama.AsyncClient(host=server.url(""))
    arrivals: list[int] = []
    last: Any = None
    async for part in await client.chat(
        model="llama3.2", messages=MESSAGES, stream=True, options={"num_predict": MAX_TOKENS}
    ):
        if part.message.content:
            arrivals.append(time.time_ns())
        last = part
    assert (last.prompt_eval_count, last.eval_count) == (PROMPT_TOKENS, MAX_TOKENS)
    found = the_attempt(telemetry)
    assert (found["gen_ai.usage.input_tokens"], found["gen_ai.usage.output_tokens"]) == (
        PROMPT_TOKENS,
        MAX_TOKENS,
    )
    assert found["gen_ai.provider.name"] == "ollama"
    # The server's own split, as its last line says it.
    assert found["llm_latency.server.prefill_time"] == pytest.approx(
        last.prompt_eval_duration / 1e9
    )
    assert found["llm_latency.server.decode_time"] == pytest.approx(last.eval_duration / 1e9)
    assert found["llm_latency.server.prefill_time"] >= TTFB + PREFILL_PER_TOKEN * 6 - EARLY
    assert found["llm_latency.server.decode_time"] >= (MAX_TOKENS - 1) * GAP - EARLY
    (request,) = telemetry.requests()
    assert_times_agree(request, arrivals, MAX_TOKENS)


# -- plain clients ---------------------------------------------------------------------------

BODY = {"model": "gpt-test", "messages": MESSAGES, "max_tokens": MAX_TOKENS}


async def post_json(client: str, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` with one of the plain clients and return the answer's JSON."""
    if client == "aiohttp":
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=body) as response:
                result: dict[str, Any] = await response.json()
                return result
    if client == "httpx":
        async with httpx.AsyncClient() as http:
            return dict((await http.post(url, json=body)).json())
    return dict((await asyncio.to_thread(requests.post, url, json=body, timeout=30)).json())


@pytest.mark.parametrize("client", ["aiohttp", "httpx", "requests"])
async def test_plain_client_json_answer(
    telemetry: Telemetry, server: RunningServer, client: str
) -> None:
    answer = await post_json(client, server.url(), BODY)
    usage = answer["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (PROMPT_TOKENS, MAX_TOKENS)
    found = the_attempt(telemetry)
    assert found["gen_ai.usage.input_tokens"] == PROMPT_TOKENS
    assert found["gen_ai.usage.output_tokens"] == MAX_TOKENS
    assert found["gen_ai.response.model"] == "gpt-test"
    # Not streamed: only the server's upper bound per token, from its own time.
    assert found["llm_latency.server.time_per_output_token_max"] == pytest.approx(
        found["llm_latency.server.processing_time"] / MAX_TOKENS
    )
    assert "llm_latency.time_to_first_token" not in found
    # The whole answer was generated before the headers: its decode is in the server's time.
    assert found["llm_latency.server.processing_time"] >= TTFB + MAX_TOKENS * GAP - EARLY


@pytest.mark.parametrize("client", ["aiohttp", "httpx", "requests"])
async def test_plain_client_stream_with_usage(
    telemetry: Telemetry, server: RunningServer, client: str
) -> None:
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    arrivals: list[int] = []

    def content(line: bytes) -> None:
        if b'"content": "' in line or b'"content":"' in line:
            arrivals.append(time.time_ns())

    if client == "aiohttp":
        async with aiohttp.ClientSession() as session:
            async with session.post(server.url(), json=body) as response:
                async for line in response.content:
                    content(line)
    elif client == "httpx":
        async with httpx.AsyncClient() as http:
            async with http.stream("POST", server.url(), json=body) as streamed:
                async for text in streamed.aiter_lines():
                    content(text.encode())
    else:

        def read() -> None:
            with requests.post(server.url(), json=body, stream=True, timeout=30) as response:
                for line in response.iter_lines():
                    content(line)

        await asyncio.to_thread(read)
    assert len(arrivals) == MAX_TOKENS
    (request,) = telemetry.requests()
    found = attrs(request)
    assert (found["gen_ai.usage.input_tokens"], found["gen_ai.usage.output_tokens"]) == (
        PROMPT_TOKENS,
        MAX_TOKENS,
    )
    assert_times_agree(request, arrivals, MAX_TOKENS)
    # One token-usage record per token type, and one time per output token.
    points = {
        dict(p.attributes)["gen_ai.token.type"]: p
        for p in telemetry.metric_points("gen_ai.client.token.usage")
    }
    assert {kind: (p.count, p.sum) for kind, p in points.items()} == {
        "input": (1, PROMPT_TOKENS),
        "output": (1, MAX_TOKENS),
    }
    assert dict(points["input"].attributes) == {
        "gen_ai.token.type": "input",
        "gen_ai.response.model": "gpt-test",
        "server.address": "127.0.0.1",
    }
    (tpot,) = telemetry.metric_points("llm_latency.time_per_output_token")
    assert tpot.count == 1
    assert tpot.sum == pytest.approx(found["llm_latency.time_per_output_token"])
    (ttft,) = telemetry.metric_points("llm_latency.time_to_first_token")
    assert (ttft.count, dict(ttft.attributes)) == (
        1,
        {"gen_ai.response.model": "gpt-test", "server.address": "127.0.0.1"},
    )
    assert ttft.sum == pytest.approx(found["llm_latency.time_to_first_token"])


async def test_an_answer_without_usage_or_off_the_llm_routes_says_nothing(
    telemetry: Telemetry, server: RunningServer
) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url("/v1/models")) as response:
            await response.json()  # an LLM route, no usage in its answer
        async with session.post(server.url("/not/a/route"), json=BODY) as response:
            await response.read()  # an OpenAI-shaped 404
    for span in telemetry.requests():
        assert not [name for name in attrs(span) if name.startswith(("gen_ai.", "llm_latency.t"))]
    assert telemetry.metric_points("gen_ai.client.token.usage") == []


# -- a model server under load ---------------------------------------------------------------


async def test_queueing_shows_in_the_time_to_first_token_not_in_the_decode(
    telemetry: Telemetry,
) -> None:
    """One generation slot, three streams at once: each waits for the ones before it, so its
    first token comes a whole generation later; once generating, each decodes at the pace."""
    tokens = 5
    profile = Profile(ttfb=TTFB, tokens=tokens, tokens_per_second=1 / GAP, slots=1)
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    async with running(profile) as mock, aiohttp.ClientSession() as session:

        async def one() -> None:
            async with session.post(mock.url(), json=body) as response:
                await response.read()

        await asyncio.gather(one(), one(), one())
    found = [attrs(s) for s in telemetry.requests()]
    ttfts = sorted(a["llm_latency.time_to_first_token"] for a in found)
    generation = TTFB + (tokens - 1) * GAP  # a slot's time from its start to the last token
    assert ttfts[1] - ttfts[0] >= generation - EARLY
    assert ttfts[2] - ttfts[0] >= 2 * generation - EARLY
    for answer in found:
        assert answer["gen_ai.usage.output_tokens"] == tokens
        decode = answer["llm_latency.time_per_output_token"] * (tokens - 1)
        assert decode >= (tokens - 1) * GAP - RESOLUTION


def test_every_usage_field_has_its_span_attribute() -> None:
    assert set(USAGE_ATTRIBUTES) == {field.name for field in fields(Usage)}
