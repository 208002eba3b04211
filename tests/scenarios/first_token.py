"""The wait before the first token, in each stream format: a loopback server that answers at
once with its headers and its control events (OpenAI's role-only delta, the Responses API's
``response.created``, Anthropic's ``message_start`` and ``ping``), then waits (the provider's
queue, a long prefill, hidden reasoning) before the first token; or pauses in the middle of the
tokens (a real stall). Gemini and Ollama send no control event: their wait comes before the
first chunk.

A request says what to do in its URL: ``wait`` (s) after the control events, ``pause`` (s)
after ``at`` tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.scenarios.peers import serving

#: Tokens in each answer, and the pause between two of them (s).
TOKENS = 20
TOKEN_GAP = 0.01
MODEL = "m"


def _sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _line(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode() + b"\n"


@dataclass(frozen=True)
class Format:
    """One stream format: its route, content type, the events before the first token, one
    token's event, and the events after the last (with the usage)."""

    name: str
    route: str
    content_type: str
    control: Callable[[int], list[bytes]]
    token: Callable[[int], bytes]
    closing: Callable[[int, int], list[bytes]]  # (input tokens, output tokens)


def _chat_chunk(delta: dict[str, Any], **extra: Any) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": None}
    return _sse({"id": "c1", "object": "chat.completion.chunk", "model": MODEL,
                 "choices": [choice], **extra})  # fmt: skip


OPENAI_CHAT = Format(
    "openai-chat",
    "/v1/chat/completions",
    "text/event-stream",
    lambda _: [_chat_chunk({"role": "assistant", "content": ""})],
    lambda i: _chat_chunk({"content": f"w{i} "}),
    lambda inp, out: [
        _sse({"id": "c1", "object": "chat.completion.chunk", "model": MODEL, "choices": [],
              "usage": {"prompt_tokens": inp, "completion_tokens": out,
                        "total_tokens": inp + out}}),
        b"data: [DONE]\n\n",
    ],
)  # fmt: skip


def _response(status: str, usage: dict[str, int] | None) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "model": MODEL, "status": status,
            "output": [], "usage": usage}  # fmt: skip


def _event(kind: str, **fields: Any) -> bytes:
    return _sse({"type": kind, **fields}, event=kind)


RESPONSES = Format(
    "responses",
    "/v1/responses",
    "text/event-stream",
    lambda _: [
        _event("response.created", response=_response("in_progress", None)),
        _event("response.in_progress", response=_response("in_progress", None)),
    ],
    lambda i: _event("response.output_text.delta", output_index=0, content_index=0,
                     delta=f"w{i} "),
    lambda inp, out: [
        _event("response.completed", response=_response(
            "completed", {"input_tokens": inp, "output_tokens": out,
                          "total_tokens": inp + out})),
    ],
)  # fmt: skip

ANTHROPIC = Format(
    "anthropic",
    "/v1/messages",
    "text/event-stream",
    lambda inp: [
        _event("message_start", message={"id": "msg_1", "type": "message", "role": "assistant",
               "model": MODEL, "content": [], "usage": {"input_tokens": inp, "output_tokens": 1}}),
        _event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        _event("ping"),
    ],
    lambda i: _event("content_block_delta", index=0,
                     delta={"type": "text_delta", "text": f"w{i} "}),
    lambda inp, out: [
        _event("content_block_stop", index=0),
        _event("message_delta", delta={"stop_reason": "end_turn"},
               usage={"output_tokens": out}),
        _event("message_stop"),
    ],
)  # fmt: skip


def _gemini(text: str, inp: int = 0, out: int = 0) -> bytes:
    """A chunk of Gemini's stream; the last one carries the usage."""
    chunk: dict[str, Any] = {
        "candidates": [{"content": {"parts": [{"text": text}], "role": "model"}}],
        "modelVersion": MODEL,
    }
    if inp:
        usage = {"promptTokenCount": inp, "candidatesTokenCount": out, "totalTokenCount": inp + out}
        chunk["usageMetadata"] = usage
    return _sse(chunk)


GEMINI = Format(
    "gemini",
    f"/v1beta/models/{MODEL}:streamGenerateContent",
    "text/event-stream",
    lambda _: [],
    lambda i: _gemini(f"w{i} "),
    lambda inp, out: [_gemini("", inp, out)],
)

OLLAMA = Format(
    "ollama",
    "/api/chat",
    "application/x-ndjson",
    lambda _: [],
    lambda i: _line({"model": MODEL, "message": {"role": "assistant", "content": f"w{i} "},
                     "done": False}),
    lambda inp, out: [_line({"model": MODEL, "message": {"role": "assistant", "content": ""},
                             "done": True, "done_reason": "stop", "prompt_eval_count": inp,
                             "eval_count": out})],
)  # fmt: skip

FORMATS: tuple[Format, ...] = (OPENAI_CHAT, RESPONSES, ANTHROPIC, GEMINI, OLLAMA)


def _prompt_tokens(body: Any) -> int:
    """The prompt's words, as the test's server counts tokens."""
    text = json.dumps(body.get("messages") or body.get("input") or body.get("contents") or "")
    return max(len(text.split()), 1)


@contextlib.asynccontextmanager
async def first_token_server() -> AsyncIterator[str]:
    """A server of every format in :data:`FORMATS`; yields its base URL."""

    def handler(fmt: Format) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            wait = float(request.query.get("wait", 0))
            pause = float(request.query.get("pause", 0))
            at = int(request.query.get("at", TOKENS // 2))
            inputs = _prompt_tokens(body)
            response = web.StreamResponse(headers={"content-type": fmt.content_type})
            await response.prepare(request)
            for data in fmt.control(inputs):
                await response.write(data)
            await asyncio.sleep(wait)
            for i in range(TOKENS):
                await asyncio.sleep(pause if pause and i == at else TOKEN_GAP)
                await response.write(fmt.token(i))
            for data in fmt.closing(inputs, TOKENS):
                await response.write(data)
            await response.write_eof()
            return response

        return handle

    app = web.Application()
    for fmt in FORMATS:
        app.router.add_post(fmt.route, handler(fmt))
    async with serving(app) as base:
        yield base


def request_body(fmt: Format, words: int = 30) -> dict[str, Any]:
    """A streamed request of ``fmt`` whose prompt is ``words`` words."""
    prompt = " ".join(f"p{i}" for i in range(words))
    if fmt is GEMINI:
        return {"contents": [{"role": "user", "parts": [{"text": prompt}]}]}
    if fmt is RESPONSES:
        return {"model": MODEL, "input": prompt, "stream": True}
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                            "stream": True}  # fmt: skip
    if fmt is OPENAI_CHAT:
        body["stream_options"] = {"include_usage": True}
    return body


def url_of(base: str, fmt: Format, **query: float) -> str:
    """The URL of ``fmt``'s route on the server at ``base``, with its instructions."""
    if fmt is GEMINI:
        query = {**query, "alt": "sse"}  # type: ignore[dict-item]
    args = "&".join(f"{k}={v}" for k, v in query.items())
    return f"{base}{fmt.route}" + (f"?{args}" if args else "")
