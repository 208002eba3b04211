"""The mock server's Anthropic API: ``POST /v1/messages``, a JSON message or (``"stream":
true``) Anthropic's Server-Sent Events, in the shapes of the ``anthropic`` SDK's types.

A stream is ``message_start``, ``content_block_start``, a ``ping``, one
``content_block_delta`` per token, ``content_block_stop``, ``message_delta`` (``stop_reason``
``end_turn`` and the output usage) and ``message_stop``. Every response carries ``request-id``
and the ``anthropic-ratelimit-*`` headers (the resets as RFC 3339 times, as Anthropic sends
them); the scripted 429 carries ``retry-after`` in whole seconds, Anthropic's only retry hint.

A request that offers ``tools``, and whose last message is not a ``tool_result``, is answered
with a ``tool_use`` block calling the first tool (``stop_reason`` ``tool_use``): streamed, its
``content_block_start`` names the tool (a token: the model wrote the name), the first
``input_json_delta`` is empty, as Anthropic's is, then each token is a piece of the input.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from llm_latency.testing.mock_common import (
    Part,
    Turn,
    arguments,
    request_id,
    rfc3339,
    sse,
    start_turn,
    tool_called,
    write_stream,
)

MODEL = "mock-claude"
TOKEN_LIMIT = 400000


def headers(turn: Turn, rate_limited: bool = False) -> dict[str, str]:
    """Anthropic's response headers: ``request-id`` and the rate limits, per kind."""
    limit = turn.profile.rate_limit_requests
    remaining = 0 if rate_limited else max(limit - turn.number % limit, 0)
    tokens = TOKEN_LIMIT - (turn.number * 100) % TOKEN_LIMIT
    reset = rfc3339(1.0)
    result = {
        "request-id": request_id(),
        "anthropic-ratelimit-requests-limit": str(limit),
        "anthropic-ratelimit-requests-remaining": str(remaining),
        "anthropic-ratelimit-requests-reset": reset,
    }
    for kind, share in (("tokens", 1), ("input-tokens", 2), ("output-tokens", 2)):
        result[f"anthropic-ratelimit-{kind}-limit"] = str(TOKEN_LIMIT // share)
        result[f"anthropic-ratelimit-{kind}-remaining"] = str(tokens // share)
        result[f"anthropic-ratelimit-{kind}-reset"] = reset
    return result


def _error(kind: str, message: str, status: int, headers: dict[str, str]) -> web.Response:
    body = {
        "type": "error",
        "error": {"type": kind, "message": message},
        "request_id": headers["request-id"],
    }
    return web.json_response(body, status=status, headers=headers)


def _usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": output_tokens,
    }


async def messages(request: web.Request) -> web.StreamResponse:
    """``POST /v1/messages``."""
    turn = await start_turn(request)
    if turn.failure == "rate_limit":
        limited = {**headers(turn, rate_limited=True), "retry-after": turn.retry_after_seconds()}
        return _error("rate_limit_error", "Rate limit reached (mock)", 429, limited)
    if turn.failure == "error":
        return _error("api_error", "Internal server error (mock)", 500, headers(turn))
    stream = bool(turn.body.get("stream"))
    await turn.answer(stream)
    words = turn.words()
    message: dict[str, Any] = {
        "id": f"msg_{request_id('')}",
        "type": "message",
        "role": "assistant",
        "model": turn.model(MODEL),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
    }
    tool = tool_called(turn.body)
    if not stream:
        block: dict[str, Any] = {"type": "text", "text": "".join(words)}
        if tool is not None:
            given = json.loads("".join(arguments(words[1:])))
            block = {
                "type": "tool_use",
                "id": f"toolu_{request_id('')}",
                "name": tool,
                "input": given,
            }
        message.update(
            content=[block],
            stop_reason="end_turn" if tool is None else "tool_use",
            usage=_usage(turn.input_tokens, len(words)),
        )
        return web.json_response(message, headers=headers(turn))
    response = web.StreamResponse(headers=headers(turn))
    response.content_type = "text/event-stream"
    events = _events(message, words, turn.input_tokens, tool)
    return await write_stream(request, response, turn, events)


def _events(
    message: dict[str, Any], words: list[str], input_tokens: int, tool: str | None
) -> list[tuple[Part, bool]]:
    def event(kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, **fields}, event=kind)

    start = {**message, "usage": _usage(input_tokens, 1)}
    pieces: list[tuple[Part, bool]] = [(event("message_start", message=start), False)]
    if tool is None:
        block: dict[str, Any] = {"type": "text", "text": ""}
        pieces += [(event("content_block_start", index=0, content_block=block), False)]
        pieces += [(event("ping"), False)]
        pieces += [
            (event("content_block_delta", index=0, delta={"type": "text_delta", "text": w}), True)
            for w in words
        ]
    else:
        call = {"type": "tool_use", "id": f"toolu_{request_id('')}", "name": tool, "input": {}}
        pieces += [(event("content_block_start", index=0, content_block=call), True)]
        pieces += [(event("ping"), False)]
        # The first input delta is empty; a one-token answer's "{}" is no token of its own.
        inputs = ["", *arguments(words[1:])]
        pieces += [
            (
                event("content_block_delta", index=0,
                      delta={"type": "input_json_delta", "partial_json": piece}),
                bool(piece) and len(words) > 1,
            )
            for piece in inputs
        ]  # fmt: skip
    delta = {"stop_reason": "end_turn" if tool is None else "tool_use", "stop_sequence": None}
    pieces += [
        (event("content_block_stop", index=0), False),
        (event("message_delta", delta=delta, usage={"output_tokens": len(words)}), False),
        (event("message_stop"), False),
    ]
    return pieces


def models() -> web.Response:
    """``GET /v1/models`` in Anthropic's shape."""
    model = {
        "type": "model",
        "id": MODEL,
        "display_name": "Mock Claude",
        "created_at": "2025-01-01T00:00:00Z",
    }
    body = {"data": [model], "has_more": False, "first_id": MODEL, "last_id": MODEL}
    return web.json_response(body, headers={"request-id": request_id()})
