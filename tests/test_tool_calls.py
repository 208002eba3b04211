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

import httpx
import pytest
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan

from llm_latency import tokens
from tests.conftest import Telemetry
from tests.servers import serving
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
