"""A loopback server in the shape of the Gemini, Mistral, Cohere and Groq APIs, enough for their
real SDKs (google-genai, mistralai, cohere, groq): a chat call streamed and not, each provider's
headers, and scripted 429s (``fail_next``) with the provider's error body.

Each provider lives under its own prefix (``/gemini``, ``/mistral``, ``/cohere``, ``/groq``),
which the SDKs take as their base URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.servers import serving

WAIT = 0.05  # server "processing" before the headers
TOKENS = ["Hello", ",", " world", "!"]
TOKEN_GAP = 0.02
#: The prompt\'s tokens every API reports (the answer\'s are len(TOKENS)).
PROMPT_TOKENS = 3
RETRY_AFTER_MS = 100  # what a 429 asks for, in retry-after-ms

#: Each provider's headers on a success, as its API sends them (see provider_profiles.py).
HEADERS: dict[str, dict[str, str]] = {
    "gemini": {"server-timing": f"gfet4t7; dur={int(WAIT * 1000)}"},
    "mistral": {
        "mistral-correlation-id": "corr_mistral_1",
        "x-kong-request-id": "corr_mistral_1",
        "x-envoy-upstream-service-time": str(int(WAIT * 1000)),
        "x-ratelimit-remaining-req-minute": "59",
        "x-ratelimit-remaining-tokens-minute": "49000",
        "x-ratelimit-limit-req-minute": "60",
    },
    "cohere": {
        "x-debug-trace-id": "trace_cohere_1",
        "x-envoy-upstream-service-time": str(int(WAIT * 1000)),
        "x-trial-endpoint-call-remaining": "9",
        "x-trial-endpoint-call-limit": "10",
    },
    "groq": {
        "x-request-id": "req_groq_1",
        "x-groq-region": "test",
        "x-ratelimit-remaining-requests": "14399",
        "x-ratelimit-reset-requests": "6s",
    },
}

#: Each provider's 429 body.
_RATE_LIMITED: dict[str, dict[str, Any]] = {
    "gemini": {"error": {"code": 429, "message": "Resource exhausted.", "status": "RESOURCE_EXHAUSTED"}},
    "mistral": {"object": "error", "message": "Rate limit exceeded", "type": "rate_limited", "code": "1300"},
    "cohere": {"message": "You are using a Trial key, which is limited."},
    "groq": {"error": {"message": "Rate limit reached", "type": "tokens", "code": "rate_limit_exceeded"}},
}  # fmt: skip

#: The request id a 429 carries, by provider (Gemini sends none).
RATE_LIMITED_IDS: dict[str, dict[str, str]] = {
    "gemini": {},
    "mistral": {"mistral-correlation-id": "corr_429"},
    "cohere": {"x-debug-trace-id": "trace_429"},
    "groq": {"x-request-id": "req_429"},
}


@dataclass
class GenAIServer:
    port: int
    #: The next this many requests (any provider) get a 429.
    fail_next: int = 0
    #: Paths requested, in order.
    paths: list[str] = field(default_factory=list)

    def base(self, provider: str) -> str:
        return f"http://127.0.0.1:{self.port}/{provider}"


SERVER = web.AppKey("server", GenAIServer)


async def _receive(
    request: web.Request, provider: str
) -> tuple[dict[str, Any], web.Response | None]:
    """Record the request and read its body; then a scripted 429, or the server's time."""
    server = request.app[SERVER]
    server.paths.append(request.path)
    body = await request.json()
    if server.fail_next > 0:
        server.fail_next -= 1
        headers = {"retry-after-ms": str(RETRY_AFTER_MS), **RATE_LIMITED_IDS[provider]}
        return body, web.json_response(_RATE_LIMITED[provider], status=429, headers=headers)
    await asyncio.sleep(WAIT)
    return body, None


async def _sse(
    request: web.Request, provider: str, events: list[str], done: str | None = None
) -> web.StreamResponse:
    """Stream ``events`` (each an SSE event's text, without the blank line) a gap apart."""
    response = web.StreamResponse(headers=HEADERS[provider])
    response.content_type = "text/event-stream"
    await response.prepare(request)
    for i, event in enumerate(events):
        if i:
            await asyncio.sleep(TOKEN_GAP)
        await response.write(f"{event}\n\n".encode())
    if done is not None:
        await response.write(f"{done}\n\n".encode())
    await response.write_eof()
    return response


def _data(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}"


# -- Gemini: POST {base}/v1beta/models/{model}:generateContent, :streamGenerateContent?alt=sse --


def _gemini_chunk(text: str, last: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {
        "content": {"role": "model", "parts": [{"text": text}]},
        "index": 0,
    }
    if last:
        candidate["finishReason"] = "STOP"
    return {"candidates": [candidate], "modelVersion": "gemini-test", "responseId": "resp_1",
            "usageMetadata": {"promptTokenCount": PROMPT_TOKENS,
                              "candidatesTokenCount": len(TOKENS),
                              "totalTokenCount": PROMPT_TOKENS + len(TOKENS)}}  # fmt: skip


async def _gemini(request: web.Request) -> web.StreamResponse:
    _, failure = await _receive(request, "gemini")
    if failure is not None:
        return failure
    method = request.match_info["method"]
    if method == "generateContent":
        return web.json_response(_gemini_chunk("".join(TOKENS), True), headers=HEADERS["gemini"])
    assert method == "streamGenerateContent" and request.query.get("alt") == "sse", request.url
    chunks = [_gemini_chunk(t, i == len(TOKENS) - 1) for i, t in enumerate(TOKENS)]
    return await _sse(request, "gemini", [_data(c) for c in chunks])


# -- Mistral and Groq: the OpenAI chat completions shape --------------------------------------


def _openai_style(provider: str, model_default: str) -> Callable[[web.Request], Any]:
    async def chat(request: web.Request) -> web.StreamResponse:
        body, failure = await _receive(request, provider)
        if failure is not None:
            return failure
        base = {"id": "cmpl-1", "created": 0, "model": body.get("model", model_default)}
        usage = {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": len(TOKENS),
            "total_tokens": PROMPT_TOKENS + len(TOKENS),
        }
        if not body.get("stream"):
            return web.json_response(
                {**base, "object": "chat.completion", "usage": usage,
                 "choices": [{"index": 0, "finish_reason": "stop",
                              "message": {"role": "assistant", "content": "".join(TOKENS)}}]},
                headers=HEADERS[provider],
            )  # fmt: skip
        chunks = [
            {**base, "object": "chat.completion.chunk",
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": token},
                          "finish_reason": "stop" if i == len(TOKENS) - 1 else None}]}
            for i, token in enumerate(TOKENS)
        ]  # fmt: skip
        return await _sse(request, provider, [_data(c) for c in chunks], done="data: [DONE]")

    return chat


# -- Cohere: POST {base}/v2/chat, streamed as SSE events named by their type -------------------


async def _cohere(request: web.Request) -> web.StreamResponse:
    body, failure = await _receive(request, "cohere")
    if failure is not None:
        return failure
    usage = {"billed_units": {"input_tokens": PROMPT_TOKENS, "output_tokens": len(TOKENS)},
             "tokens": {"input_tokens": PROMPT_TOKENS, "output_tokens": len(TOKENS)}}  # fmt: skip
    if not body.get("stream"):
        return web.json_response(
            {"id": "c-1", "finish_reason": "COMPLETE", "usage": usage,
             "message": {"role": "assistant",
                         "content": [{"type": "text", "text": "".join(TOKENS)}]}},
            headers=HEADERS["cohere"],
        )  # fmt: skip
    events: list[dict[str, Any]] = [
        {"type": "message-start", "id": "c-1", "delta": {"message": {"role": "assistant"}}},
        {"type": "content-start", "index": 0,
         "delta": {"message": {"content": {"type": "text", "text": ""}}}},
        *({"type": "content-delta", "index": 0,
           "delta": {"message": {"content": {"text": t}}}} for t in TOKENS),
        {"type": "content-end", "index": 0},
        {"type": "message-end", "delta": {"finish_reason": "COMPLETE", "usage": usage}},
    ]  # fmt: skip
    return await _sse(request, "cohere", [f"event: {e['type']}\n{_data(e)}" for e in events])


@contextlib.asynccontextmanager
async def genai_server() -> AsyncIterator[GenAIServer]:
    server = GenAIServer(0)
    app = web.Application()
    app[SERVER] = server
    app.router.add_post(r"/gemini/{version}/models/{model:[^/:]+}:{method:[A-Za-z]+}", _gemini)
    app.router.add_post("/mistral/v1/chat/completions", _openai_style("mistral", "mistral-test"))
    app.router.add_post("/groq/openai/v1/chat/completions", _openai_style("groq", "groq-test"))
    app.router.add_post("/cohere/v2/chat", _cohere)
    async with serving(app) as server.port:
        yield server
