"""A loopback server that speaks enough of the OpenAI and Anthropic APIs for their real SDKs:
chat completions and messages, streamed (each provider's SSE format) and not, provider headers,
and scripted failures (a 429 with ``retry-after-ms`` on the first attempts of a scenario)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

WAIT = 0.05  # server "processing" before the headers
TOKENS = ["Hello", ",", " world", "!"]
TOKEN_GAP = 0.02
#: The prompt's tokens the server reports (the answer's are len(TOKENS)).
PROMPT_TOKENS = 3


@dataclass
class ProviderServer:
    port: int
    attempts: Counter[str] = field(default_factory=Counter)
    seen_headers: list[dict[str, str]] = field(default_factory=list)

    @property
    def openai_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _scripted_failure(request: web.Request, server: ProviderServer) -> web.Response | None:
    """``x-test-scenario: NAME`` with ``x-test-fail: N`` answers 429 to the first N attempts."""
    scenario = request.headers.get("x-test-scenario")
    if scenario is None:
        return None
    server.attempts[scenario] += 1
    if server.attempts[scenario] <= int(request.headers.get("x-test-fail", "0")):
        return web.json_response(
            {"error": {"message": "Rate limit reached", "type": "rate_limit_error"}},
            status=429,
            headers={"retry-after-ms": "150", "retry-after": "1", "x-request-id": "req_429",
                     "request-id": "req_429", "x-should-retry": "true"},
        )  # fmt: skip
    return None


def _openai_headers() -> dict[str, str]:
    return {
        "x-request-id": "req_openai_1",
        "openai-processing-ms": str(int(WAIT * 1000)),
        "openai-model": "gpt-test",
        "x-ratelimit-limit-requests": "100",
        "x-ratelimit-remaining-requests": "99",
        "x-ratelimit-remaining-tokens": "5000",
        "x-ratelimit-reset-requests": "600ms",
    }


async def _receive(request: web.Request) -> tuple[dict[str, Any], web.Response | None]:
    """Record the request, read its JSON body; then either a scripted failure, or the
    server's processing time passes."""
    server = request.app[SERVER]
    server.seen_headers.append({k.lower(): v for k, v in request.headers.items()})
    body = await request.json()
    if (failure := _scripted_failure(request, server)) is not None:
        return body, failure
    await asyncio.sleep(WAIT)
    return body, None


async def _chat(request: web.Request) -> web.StreamResponse:
    body, failure = await _receive(request)
    if failure is not None:
        return failure
    base = {"id": "chatcmpl-1", "created": 0, "model": body.get("model", "gpt-test")}
    if not body.get("stream"):
        return web.json_response(
            {**base, "object": "chat.completion",
             "choices": [{"index": 0, "finish_reason": "stop",
                          "message": {"role": "assistant", "content": "".join(TOKENS)}}],
             "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": len(TOKENS),
                       "total_tokens": PROMPT_TOKENS + len(TOKENS)}},
            headers=_openai_headers(),
        )  # fmt: skip
    response = web.StreamResponse(headers=_openai_headers())
    response.content_type = "text/event-stream"
    await response.prepare(request)
    for i, token in enumerate(TOKENS):
        if i:
            await asyncio.sleep(TOKEN_GAP)
        chunk = {**base, "object": "chat.completion.chunk",
                 "choices": [{"index": 0, "delta": {"content": token}, "finish_reason": None}]}  # fmt: skip
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _anthropic_headers() -> dict[str, str]:
    return {
        "request-id": "req_anthropic_1",
        "anthropic-ratelimit-requests-remaining": "49",
        "x-ratelimit-remaining-requests": "49",
    }


async def _messages(request: web.Request) -> web.StreamResponse:
    body, failure = await _receive(request)
    if failure is not None:
        return failure
    message = {"id": "msg_1", "type": "message", "role": "assistant",
               "model": body.get("model", "claude-test"), "stop_reason": None,
               "stop_sequence": None, "usage": {"input_tokens": PROMPT_TOKENS, "output_tokens": 0}}  # fmt: skip
    if not body.get("stream"):
        return web.json_response(
            {**message, "content": [{"type": "text", "text": "".join(TOKENS)}],
             "stop_reason": "end_turn",
             "usage": {"input_tokens": PROMPT_TOKENS, "output_tokens": len(TOKENS)}},
            headers=_anthropic_headers(),
        )  # fmt: skip
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": {**message, "content": []}}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        *[("content_block_delta", {"type": "content_block_delta", "index": 0,
                                   "delta": {"type": "text_delta", "text": t}}) for t in TOKENS],
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                           "stop_sequence": None}, "usage": {"output_tokens": len(TOKENS)}}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip
    response = web.StreamResponse(headers=_anthropic_headers())
    response.content_type = "text/event-stream"
    await response.prepare(request)
    for i, (name, data) in enumerate(events):
        if i:
            await asyncio.sleep(TOKEN_GAP / 2)
        await response.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
    await response.write_eof()
    return response


SERVER = web.AppKey("server", ProviderServer)


@contextlib.asynccontextmanager
async def provider_server() -> AsyncIterator[ProviderServer]:
    server = ProviderServer(0)
    app = web.Application()
    app[SERVER] = server
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/messages", _messages)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.port = runner.addresses[0][1]
    try:
        yield server
    finally:
        await runner.cleanup()
