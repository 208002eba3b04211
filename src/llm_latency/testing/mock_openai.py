"""The mock server's OpenAI API: ``POST /v1/chat/completions`` (JSON, or Server-Sent Events
with ``"stream": true``) and ``GET /v1/models``, in the shapes of the ``openai`` SDK's types.

A stream is one ``chat.completion.chunk`` per token (the first also carries the assistant's
role), then a chunk with an empty delta and ``finish_reason: "stop"``, then, when the request
asks for ``stream_options: {"include_usage": true}``, a chunk with no choices and the usage
(every chunk before it then carries ``"usage": null``, as OpenAI's do), then ``data: [DONE]``.

A request that offers ``tools``, and whose last message is not a tool's result, is answered as
an agent's model answers it: a call of the first tool. Streamed, its first chunk names the tool
with ``"arguments": ""`` (a token: the model wrote the name), then each token is a piece of the
arguments; ``finish_reason`` is ``"tool_calls"``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from llm_latency.testing.mock_common import (
    Part,
    Turn,
    arguments,
    now_seconds,
    request_id,
    sse,
    start_turn,
    tool_called,
    write_stream,
)

MODEL = "mock-gpt"


def headers(turn: Turn) -> dict[str, str]:
    """OpenAI's response headers: the request id, the time the server really spent from the
    request's arrival to now (``openai-processing-ms``, whole ms, never more than spent) and the
    rate limits."""
    limit = turn.profile.rate_limit_requests
    number = turn.number
    return {
        "x-request-id": request_id(),
        "openai-processing-ms": str(int(turn.elapsed() * 1000)),
        "openai-model": MODEL,
        "x-ratelimit-limit-requests": str(limit),
        "x-ratelimit-remaining-requests": str(max(limit - number % limit, 0)),
        "x-ratelimit-limit-tokens": "200000",
        "x-ratelimit-remaining-tokens": str(200000 - (number * 100) % 200000),
        "x-ratelimit-reset-requests": "1s",
    }


def error_body(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    """An error in OpenAI's shape."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def failure_response(turn: Turn) -> web.Response | None:
    """The scripted 429 (with ``retry-after-ms`` and ``retry-after``) or 500, if any."""
    if turn.failure == "rate_limit":
        return web.json_response(
            error_body("Rate limit reached (mock)", "requests", "rate_limit_exceeded"),
            status=429,
            headers={
                **headers(turn),
                "retry-after-ms": str(turn.profile.retry_after_ms),
                "retry-after": turn.retry_after_seconds(),
            },
        )
    if turn.failure == "error":
        return web.json_response(
            error_body("Internal error (mock)", "server_error"), status=500, headers=headers(turn)
        )
    return None


def _usage(turn: Turn) -> dict[str, Any]:
    tokens, prompt = turn.output_tokens, turn.input_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": tokens,
        "total_tokens": prompt + tokens,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``."""
    turn = await start_turn(request)
    failed = failure_response(turn)
    if failed is not None:
        return failed
    stream = bool(turn.body.get("stream"))
    await turn.answer(stream)
    words = turn.words()
    base = {"id": f"chatcmpl-{turn.number}", "created": now_seconds(), "model": turn.model(MODEL)}
    tool = tool_called(turn.body)
    if tool is not None:
        return await _tool_call(request, turn, base, tool, stream)
    if not stream:
        # The whole answer is generated before the headers: that is the processing time.
        message = {"role": "assistant", "content": "".join(words), "refusal": None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
        body = {
            **base,
            "object": "chat.completion",
            "choices": [choice],
            "usage": _usage(turn),
        }
        return web.json_response(body, headers=headers(turn))
    options = turn.body.get("stream_options")
    with_usage = isinstance(options, dict) and options.get("include_usage") is True
    response = web.StreamResponse(headers=headers(turn))
    response.content_type = "text/event-stream"
    return await write_stream(request, response, turn, _chunks(turn, base, words, with_usage))


def _chunks(
    turn: Turn, base: dict[str, Any], words: list[str], with_usage: bool
) -> list[tuple[Part, bool]]:
    extra: dict[str, Any] = {"usage": None} if with_usage else {}

    def chunk(delta: dict[str, Any], finish_reason: str | None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return sse({**base, "object": "chat.completion.chunk", "choices": [choice], **extra})

    pieces: list[tuple[Part, bool]] = [
        (chunk({"role": "assistant", "content": word} if i == 0 else {"content": word}, None), True)
        for i, word in enumerate(words)
    ]
    pieces.append((chunk({}, "stop"), False))
    if with_usage:
        usage = {**base, "object": "chat.completion.chunk", "choices": [], "usage": _usage(turn)}
        pieces.append((sse(usage), False))
    pieces.append((b"data: [DONE]\n\n", False))
    return pieces


async def _tool_call(
    request: web.Request, turn: Turn, base: dict[str, Any], name: str, stream: bool
) -> web.StreamResponse:
    call_id = f"call_{request_id('')}"
    pieces = arguments(turn.words()[1:])
    if not stream:
        call = {"id": call_id, "type": "function",
                "function": {"name": name, "arguments": "".join(pieces)}}  # fmt: skip
        message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [call]}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "tool_calls"}
        body = {**base, "object": "chat.completion", "choices": [choice], "usage": _usage(turn)}
        return web.json_response(body, headers=headers(turn))
    options = turn.body.get("stream_options")
    with_usage = isinstance(options, dict) and options.get("include_usage") is True
    extra: dict[str, Any] = {"usage": None} if with_usage else {}

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return sse({**base, "object": "chat.completion.chunk", "choices": [choice], **extra})

    opening = {"index": 0, "id": call_id, "type": "function",
               "function": {"name": name, "arguments": ""}}  # fmt: skip
    parts: list[tuple[Part, bool]] = [
        (chunk({"role": "assistant", "content": None, "tool_calls": [opening]}), True)
    ]
    # A one-token answer is the name alone: its "{}" is no token of its own.
    parts += [
        (
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
            turn.output_tokens > 1,
        )
        for piece in pieces
    ]
    parts.append((chunk({}, "tool_calls"), False))
    if with_usage:
        usage = {**base, "object": "chat.completion.chunk", "choices": [], "usage": _usage(turn)}
        parts.append((sse(usage), False))
    parts.append((b"data: [DONE]\n\n", False))
    response = web.StreamResponse(headers=headers(turn))
    response.content_type = "text/event-stream"
    return await write_stream(request, response, turn, parts)


def models() -> web.Response:
    """``GET /v1/models`` in OpenAI's shape."""
    model = {"id": MODEL, "object": "model", "created": 0, "owned_by": "llm-latency"}
    return web.json_response(
        {"object": "list", "data": [model]}, headers={"x-request-id": request_id()}
    )


def not_found(request: web.Request) -> web.Response:
    """A 404 in OpenAI's shape, for any unknown path (or method)."""
    message = f"Invalid URL ({request.method} {request.path})"
    return web.json_response(
        error_body(message, "invalid_request_error"),
        status=404,
        headers={"x-request-id": request_id()},
    )
