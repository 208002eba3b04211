"""The mock server's Ollama native API: ``POST /api/chat`` and ``POST /api/generate``, plus
``GET /api/tags`` and ``GET /api/version``, as the Ollama server answers them.

Ollama streams unless the request says ``"stream": false``: newline-delimited JSON
(``application/x-ndjson``), one object a token (``"done": false``), then a last object with
``"done": true``, ``done_reason`` ``stop``, the token counts (``prompt_eval_count``,
``eval_count``) and the durations in nanoseconds (``total_duration``, ``load_duration``,
``prompt_eval_duration``, ``eval_duration``). Not streamed, the answer is that last object with
the whole text. Like Ollama, the responses carry no request id and no rate-limit headers; the
profile's scripted 429 (with ``retry-after``) and 500 come as Ollama's ``{"error": ...}``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web

from llm_latency.testing.mock_common import (
    Part,
    Turn,
    rfc3339,
    start_turn,
    write_stream,
)

MODEL = "mock-llama"
VERSION = "0.12.0"
NDJSON = "application/x-ndjson"


def _line(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode() + b"\n"


def _line_of(piece: Callable[[str], dict[str, Any]], text: str) -> bytes:
    return _line({**piece(text), "done": False})


def _failure(turn: Turn) -> web.Response | None:
    if turn.failure == "rate_limit":
        return web.json_response(
            {"error": "rate limit reached (mock)"},
            status=429,
            headers={"retry-after": turn.retry_after_seconds()},
        )
    if turn.failure == "error":
        return web.json_response({"error": "internal error (mock)"}, status=500)
    return None


def _final(turn: Turn, words: list[str]) -> dict[str, Any]:
    """The statistics of the last object, measured: the prompt's evaluation is the time from
    the slot to the first token, the generation the time since."""
    total = int(turn.elapsed() * 1e9)
    prompt = int(turn.prefill_time * 1e9)
    generation = int(max(total - int(turn.queue_time * 1e9) - prompt, 0))
    return {
        "done": True,
        "done_reason": "stop",
        "total_duration": total,
        "load_duration": 0,
        "prompt_eval_count": turn.input_tokens,
        "prompt_eval_duration": prompt,
        "eval_count": len(words),
        "eval_duration": generation,
    }


async def _answer(request: web.Request, chat: bool) -> web.StreamResponse:
    turn = await start_turn(request)
    failed = _failure(turn)
    if failed is not None:
        return failed
    stream = turn.body.get("stream", True) is not False
    await turn.answer(stream)
    words = turn.words()
    model = turn.model(MODEL)

    def piece(text: str) -> dict[str, Any]:
        base: dict[str, Any] = {"model": model, "created_at": rfc3339(precise=True)}
        if chat:
            return {**base, "message": {"role": "assistant", "content": text}}
        return {**base, "response": text}

    def last(text: str) -> dict[str, Any]:
        extra = {} if chat else {"context": list(range(turn.input_tokens + len(words)))}
        return {**piece(text), **_final(turn, words), **extra}

    if not stream:
        return web.json_response(last("".join(words)))
    response = web.StreamResponse()
    response.content_type = NDJSON

    def pieces() -> Iterator[tuple[Part, bool]]:
        # Each line is made when it is sent: its timestamp and the durations are measured.
        for word in words:
            yield functools.partial(_line_of, piece, word), True
        yield lambda: _line(last("")), False

    return await write_stream(request, response, turn, pieces())


async def chat(request: web.Request) -> web.StreamResponse:
    """``POST /api/chat``."""
    return await _answer(request, chat=True)


async def generate(request: web.Request) -> web.StreamResponse:
    """``POST /api/generate``."""
    return await _answer(request, chat=False)


async def tags(request: web.Request) -> web.Response:
    """``GET /api/tags``: the one local model."""
    details = {
        "format": "gguf",
        "family": "llama",
        "families": ["llama"],
        "parameter_size": "1B",
        "quantization_level": "Q4_K_M",
    }
    model = {
        "name": f"{MODEL}:latest",
        "model": f"{MODEL}:latest",
        "modified_at": "2025-01-01T00:00:00Z",
        "size": 0,
        "digest": "0" * 64,
        "details": details,
    }
    return web.json_response({"models": [model]})


async def version(request: web.Request) -> web.Response:
    """``GET /api/version``."""
    return web.json_response({"version": VERSION})
