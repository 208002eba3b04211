"""A tool call is generated content: recorded tool-call streams of every format llm-latency
reads (``tests/tool_call_streams.py``), replayed from a loopback server to an instrumented
httpx client, give the time to first token at the event that opens the first tool call (or the
text before it), and the time per output token from there.

The server sends the streams in lockstep with the program: each event only once the program has
read every byte before it, then after a pause. So the event that held the first token is known
without timing anything: the first token was seen after that event was sent and before the next
one was (the pause is the margin; the two clocks compared are this process's).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx
import openai
import pytest
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan

from llm_latency import tokens
from llm_latency.testing import Profile, RunningServer, running
from tests.conftest import Telemetry
from tests.servers import serving
from tests.test_tokens import (
    GAP,
    MAX_TOKENS,
    MESSAGES,
    PREFILL_PER_TOKEN,
    TTFB,
    assert_times_agree,
)
from tests.tool_call_streams import RECORDINGS, Recording

#: The pause before each event after the first, once the program has read the ones before.
PAUSE = 0.02
#: A reading of one clock against another for the same instant (time_ns, perf_counter_ns).
CLOCKS = 0.002


@dataclass
class Replay:
    """What the server replays, when it sent each event (``time.time_ns()``), and how many
    bytes the program has read."""

    recording: Recording | None = None
    sent: list[int] = field(default_factory=list)
    received: int = 0
    progress: asyncio.Event = field(default_factory=asyncio.Event)

    def read(self, size: int) -> None:
        self.received += size
        self.progress.set()

    async def until_read(self, size: int) -> None:
        while self.received < size:
            self.progress.clear()
            await asyncio.wait_for(self.progress.wait(), 30)  # a guard against a hang


REPLAY = web.AppKey("replay", Replay)


async def _replay(request: web.Request) -> web.StreamResponse:
    replay = request.app[REPLAY]
    recording = replay.recording
    assert recording is not None
    await request.read()
    response = web.StreamResponse()
    response.content_type = recording.content_type
    await response.prepare(request)
    offset = 0
    for i, event in enumerate(recording.events):
        if i:
            await replay.until_read(offset)
            await asyncio.sleep(PAUSE)
        replay.sent.append(time.time_ns())
        await response.write(event)
        offset += len(event)
    await response.write_eof()
    return response


@contextlib.asynccontextmanager
async def replaying() -> AsyncIterator[tuple[Replay, int]]:
    replay = Replay()
    app = web.Application()
    app[REPLAY] = replay
    app.router.add_post("/{path:.*}", _replay)
    async with serving(app) as port:
        yield replay, port


def first_token_at(span: ReadableSpan) -> int | None:
    """When the span's attempt saw its first token (Unix ns), None when it saw none."""
    ttft = (span.attributes or {}).get("llm_latency.time_to_first_token")
    if ttft is None:
        return None
    assert span.start_time is not None and isinstance(ttft, float)
    return span.start_time + round(ttft * 1e9)


def event_of(sent: list[int], at: int) -> int:
    """The index of the event that was the last one sent before ``at``: the event seen then."""
    margin = CLOCKS * 1e9
    return max(i for i, when in enumerate(sent) if when - margin <= at)


@pytest.mark.parametrize("recording", RECORDINGS, ids=[r.name for r in RECORDINGS])
async def test_the_first_token_is_the_tool_call_that_opens_the_answer(
    telemetry: Telemetry, recording: Recording
) -> None:
    async with replaying() as (replay, port), httpx.AsyncClient() as http:
        replay.recording = recording
        url = f"http://127.0.0.1:{port}{recording.path}"
        async with http.stream("POST", url, json={"stream": True}) as response:
            async for chunk in response.aiter_raw():
                replay.read(len(chunk))
    assert len(replay.sent) == len(recording.events)
    (span,) = telemetry.requests()
    found: dict[str, Any] = dict(span.attributes or {})
    assert found["gen_ai.usage.output_tokens"] == recording.output_tokens
    at = first_token_at(span)
    assert at is not None, "no first token"
    assert event_of(replay.sent, at) == recording.first
    tpot = found.get("llm_latency.time_per_output_token")
    if recording.first == len(recording.events) - 1:
        # The first token came in the last chunk: no time passed over the tokens after it.
        assert tpot is None
        return
    # From the first token to the last chunk, over the tokens after the first: the last chunk
    # was seen after the last event was sent, and before the span ended.
    assert isinstance(tpot, float)
    last_seen = at + tpot * (recording.output_tokens - 1) * 1e9
    assert span.end_time is not None
    assert replay.sent[-1] - CLOCKS * 1e9 <= last_seen <= span.end_time + CLOCKS * 1e9


@pytest.mark.parametrize(
    "event",
    [
        # No call yet: an empty or absent list, a finish reason that names one, a text block.
        {"choices": [{"delta": {"role": "assistant", "content": "", "tool_calls": []}}]},
        {"choices": [{"delta": {"content": None, "tool_calls": None}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
        {"type": "content_block_start", "content_block": {"type": "text", "text": ""}},
        # The Responses API's echo of the tools offered, and the server's own MCP tool list.
        {"type": "response.created",
         "response": {"output": [], "tools": [{"type": "function", "name": "get_weather"}],
                      "tool_choice": "auto"}},
        {"type": "response.output_item.added",
         "item": {"type": "mcp_list_tools", "server_label": "docs", "tools": []}},
        # A key quoted inside generated text is escaped: not a key.
        {"choices": [{"delta": {"content": ""}, "logprobs": '\\"tool_calls\\":[{\\"id'}]},
        {"choices": [{"delta": {"content": ""}, "logprobs": '\\"type\\":\\"tool_use\\"'}]},
    ],
)  # fmt: skip
def test_what_is_no_tool_call(event: dict[str, Any]) -> None:
    assert not tokens.has_content(json.dumps(event).encode())


# -- the mock server's tool calls, read by the real SDKs ----------------------------------------

WEATHER_TOOL: Any = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}

TOOLS: Any = [{"type": "function", "function": WEATHER_TOOL}]


@pytest.fixture
async def mock() -> AsyncIterator[RunningServer]:
    profile = Profile(
        ttfb=TTFB, tokens=20, tokens_per_second=1 / GAP, prefill_per_token=PREFILL_PER_TOKEN
    )
    async with running(profile) as server:
        yield server


async def test_openai_sdk_reads_the_mock_servers_tool_call(
    telemetry: Telemetry, mock: RunningServer
) -> None:
    client = openai.AsyncOpenAI(base_url=mock.url("/v1"), api_key="sk-test")
    arrivals: list[int] = []
    calls: dict[int, dict[str, str]] = {}

    async def create() -> Any:
        return await client.chat.completions.create(
            model="gpt-test", messages=MESSAGES, max_tokens=MAX_TOKENS, stream=True,
            stream_options={"include_usage": True},
            tools=TOOLS,
        )  # fmt: skip

    # The SDK's first stream builds its chunk models as they come: the measured one is the
    # second.
    async for _ in await create():
        pass
    telemetry.exporter.clear()
    stream = await create()
    finish = None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.tool_calls:
            arrivals.append(time.time_ns())
            for delta in chunk.choices[0].delta.tool_calls:
                call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                assert delta.function is not None
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    await client.close()
    assert finish == "tool_calls"
    assert calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"])["input"].split() == [
        f"token{i}" for i in range(1, MAX_TOKENS)
    ]
    # The opening delta (the name, no argument yet) is the first of MAX_TOKENS tokens.
    assert len(arrivals) == MAX_TOKENS
    (request,) = telemetry.requests()
    assert dict(request.attributes or {})["gen_ai.usage.output_tokens"] == MAX_TOKENS
    assert_times_agree(request, arrivals, MAX_TOKENS)


async def test_anthropic_sdk_reads_the_mock_servers_tool_use(
    telemetry: Telemetry, mock: RunningServer
) -> None:
    client = anthropic.AsyncAnthropic(base_url=mock.url(""), api_key="sk-ant-test")
    tool: Any = {"name": WEATHER_TOOL["name"], "input_schema": WEATHER_TOOL["parameters"]}

    async def read() -> tuple[list[int], Any]:
        arrivals: list[int] = []
        async with client.messages.stream(
            model="claude-test", max_tokens=MAX_TOKENS, messages=MESSAGES, tools=[tool]
        ) as stream:
            async for event in stream:
                if event.type == "content_block_start" or (
                    event.type == "input_json" and event.partial_json
                ):
                    arrivals.append(time.time_ns())
            return arrivals, await stream.get_final_message()

    # The SDK's first tool-use stream builds its event and block models as they come (88 ms
    # between llm-latency seeing the block's bytes and the program its event, once): the
    # measured stream is the second.
    await read()
    telemetry.exporter.clear()
    arrivals, message = await read()
    await client.close()
    assert message.stop_reason == "tool_use"
    (block,) = message.content
    assert block.type == "tool_use" and block.name == "get_weather"
    assert (
        isinstance(block.input, dict) and len(str(block.input["input"]).split()) == MAX_TOKENS - 1
    )
    assert len(arrivals) == MAX_TOKENS
    (request,) = telemetry.requests()
    assert dict(request.attributes or {})["gen_ai.usage.output_tokens"] == MAX_TOKENS
    assert_times_agree(request, arrivals, MAX_TOKENS)


async def test_a_tool_result_is_answered_in_text(mock: RunningServer) -> None:
    client = openai.AsyncOpenAI(base_url=mock.url("/v1"), api_key="sk-test")
    messages: list[Any] = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]  # fmt: skip
    answer = await client.chat.completions.create(
        model="gpt-test", messages=messages, max_tokens=MAX_TOKENS,
        tools=TOOLS,
    )  # fmt: skip
    await client.close()
    assert answer.choices[0].finish_reason == "stop"
    assert answer.choices[0].message.tool_calls is None
