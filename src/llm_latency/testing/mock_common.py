"""What every API of the mock server shares: the latency profile, the running state, one
request's turn (its number, its scripted failure, its words) and the paced writing of a stream.

It behaves like a model server where timing depends on it: a request waits for one of
``slots`` generation slots (so queueing appears by itself under load), its prefill takes
``prefill_per_token`` per prompt token (the prompt's words, counted from the request's
messages), its answer has ``tokens`` tokens or the request's ``max_tokens`` if fewer, each
decoded ``1 / tokens_per_second`` after the last. Every API reports those counts as its
provider does.

Each API shape (:mod:`~llm_latency.testing.mock_openai`, :mod:`~llm_latency.testing.mock_anthropic`,
:mod:`~llm_latency.testing.mock_ollama`) renders the same turn in its own wire format, so one
:class:`Profile` gives every route the same time to the first byte, the same tokens per second
and the same scripted 429s and 500s; the request counter is shared by all routes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from aiohttp import web

#: The request fields that cap the answer's length, by API (OpenAI's two, Anthropic's,
#: the Responses API's, Ollama's ``options.num_predict``, Gemini's ``generationConfig``).
_LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
#: The request fields that hold the prompt's text.
_PROMPT_FIELDS = ("messages", "system", "prompt", "input", "contents", "instructions")


@dataclass
class Profile:
    """How the mock server behaves.

    ``ttfb``: seconds before the first byte of an answer (a streamed one's first token), on
    top of the prefill: ``prefill_per_token`` seconds per prompt token; ``tokens_per_second``
    and ``tokens``: the answer's pace and length (a request's ``max_tokens`` caps it);
    ``slots``: answers generated at once (0: no limit), a request waits for a free one; every
    ``rate_limit_every``-th request is a 429 asking for a wait of ``retry_after_ms``; a share
    ``error_rate`` of requests is a 500 (drawn from ``seed``); ``tls_delay``: seconds added to
    each TLS handshake; ``rate_limit_requests``: the request limit the rate-limit headers show.
    """

    ttfb: float = 0.3
    tokens_per_second: float = 50.0
    tokens: int = 20
    rate_limit_every: int = 0
    retry_after_ms: int = 250
    error_rate: float = 0.0
    tls_delay: float = 0.0
    seed: int | None = None
    rate_limit_requests: int = 500
    prefill_per_token: float = 0.0
    slots: int = 0


@dataclass
class ServerState:
    """The mock server's running state; ``rate_limit_next`` makes the next N requests 429.
    ``queued`` and ``generating``: requests waiting for a slot, and holding one."""

    profile: Profile
    counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    rng: random.Random = field(default_factory=random.Random)
    rate_limit_next: int = 0
    queued: int = 0
    generating: int = 0
    _slots: asyncio.Semaphore | None = None

    def slots(self) -> asyncio.Semaphore | None:
        """The generation slots (made on the server's loop), None when unlimited."""
        if self.profile.slots <= 0:
            return None
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.profile.slots)
        return self._slots


def _texts(value: Any) -> Iterable[str]:
    """Every string in a request field (messages, content parts, Gemini's parts)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key in ("role", "type", "model"):
                continue
            yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)


def prompt_tokens(body: dict[str, Any]) -> int:
    """The prompt's tokens as the mock counts them: its words (at least one)."""
    words = sum(len(text.split()) for f in _PROMPT_FIELDS for text in _texts(body.get(f)))
    return max(words, 1)


def answer_tokens(body: dict[str, Any], tokens: int) -> int:
    """The answer's length: the profile's, or the request's limit if that is lower."""
    limits = [body.get(name) for name in _LIMIT_FIELDS]
    options = body.get("options")
    if isinstance(options, dict):
        limits.append(options.get("num_predict"))
    config = body.get("generationConfig") or body.get("generation_config")
    if isinstance(config, dict):
        limits.append(config.get("maxOutputTokens"))
    for limit in limits:
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            tokens = min(tokens, limit)
    return tokens


STATE = web.AppKey("state", ServerState)
log = logging.getLogger("llm_latency.testing.mock_server")

Failure = Literal["rate_limit", "error"]

#: A part of a streamed body: its bytes, or a function that makes them when they are sent (for
#: a part that tells the time, such as Ollama's timestamps and durations).
Part = bytes | Callable[[], bytes]


def log_to_stderr() -> None:
    """Show the server's log lines (one line per event, e.g. a client that hung up
    mid-response) on stderr: what ``llm-latency mock-server`` does."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("llm-latency mock-server: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


@dataclass
class Turn:
    """One request as the mock sees it: its number (from 1, over all routes), when it arrived,
    its JSON body (``{}`` when it has none) and the failure the profile scripts for it."""

    state: ServerState
    number: int
    arrived: float
    body: dict[str, Any]
    failure: Failure | None
    #: The prompt's and the answer's token counts.
    input_tokens: int = 1
    output_tokens: int = 0
    #: Seconds it waited for a slot, and spent on the prompt (fixed latency and prefill).
    queue_time: float = 0.0
    prefill_time: float = 0.0
    #: When its first token was ready (the loop's clock), 0 before.
    first_token_at: float = 0.0
    _slot: asyncio.Semaphore | None = None
    _holding: bool = False

    @property
    def profile(self) -> Profile:
        """The server's profile."""
        return self.state.profile

    def elapsed(self) -> float:
        """Seconds since the request arrived."""
        return asyncio.get_running_loop().time() - self.arrived

    def model(self, default: str) -> str:
        """The model the request names, else ``default``."""
        model = self.body.get("model")
        return model if isinstance(model, str) and model else default

    def words(self) -> list[str]:
        """The answer, one token a word."""
        return [f"token{i} " for i in range(self.output_tokens)]

    def generation(self) -> float:
        """Seconds the whole answer takes to generate at the profile's pace."""
        return self.output_tokens / max(self.profile.tokens_per_second, 1e-3)

    def gap(self) -> float:
        """Seconds between two tokens of a stream."""
        return 1.0 / max(self.profile.tokens_per_second, 1e-3)

    def retry_after_seconds(self) -> str:
        """``retry-after`` in whole seconds (at least 1) for the profile's ``retry_after_ms``."""
        return str(max(1, round(self.profile.retry_after_ms / 1000)))

    async def answer(self, stream: bool) -> None:
        """Wait as a model server would before its response headers: for a free slot, then the
        time to the first token (fixed latency and prefill), and for an answer that is not
        streamed, its whole generation (the slot is then free again). A streamed answer keeps
        its slot until :meth:`release` (``write_stream`` calls it)."""
        loop = asyncio.get_running_loop()
        slots = self.state.slots()
        if slots is not None:
            self.state.queued += 1
            try:
                await slots.acquire()
            finally:
                self.state.queued -= 1
        self._slot = slots
        self._holding = True
        self.state.generating += 1
        started = loop.time()
        self.queue_time = started - self.arrived
        profile = self.profile
        try:
            await asyncio.sleep(profile.ttfb + profile.prefill_per_token * self.input_tokens)
            self.first_token_at = loop.time()
            self.prefill_time = self.first_token_at - started
            if not stream:
                await asyncio.sleep(self.generation())
                self.release()
        except BaseException:  # the client left (the handler is cancelled)
            self.release()
            raise

    def release(self) -> None:
        """The answer is generated (or its client left): its slot is free. Once."""
        if not self._holding:
            return
        self._holding = False
        self.state.generating -= 1
        if self._slot is not None:
            self._slot.release()


async def start_turn(request: web.Request) -> Turn:
    """Number the request, read its body and decide whether it fails."""
    state = request.app[STATE]
    profile = state.profile
    number = next(state.counter)
    arrived = asyncio.get_running_loop().time()
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    failure: Failure | None = None
    limited = state.rate_limit_next > 0
    if limited:
        state.rate_limit_next -= 1
    if limited or (profile.rate_limit_every and number % profile.rate_limit_every == 0):
        failure = "rate_limit"
    elif profile.error_rate and state.rng.random() < profile.error_rate:
        failure = "error"
    turn = Turn(state, number, arrived, body, failure)
    turn.input_tokens = prompt_tokens(body)
    turn.output_tokens = answer_tokens(body, profile.tokens)
    return turn


def tool_called(body: dict[str, Any]) -> str | None:
    """The tool an answer calls: the first one the request offers (OpenAI's and Ollama's
    ``{"function": {"name": ...}}``, Anthropic's ``{"name": ...}``), unless its last message
    is a tool's result (a ``tool`` message, or Anthropic's ``tool_result`` block): the model
    then answers in text, as an agent's does."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools or not isinstance(tools[0], dict):
        return None
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    if isinstance(last, dict) and _is_tool_result(last):
        return None
    function = tools[0].get("function")
    name = function.get("name") if isinstance(function, dict) else tools[0].get("name")
    return name if isinstance(name, str) and name else "tool"


def _is_tool_result(message: dict[str, Any]) -> bool:
    if message.get("role") == "tool":
        return True
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(part, dict) and part.get("type") == "tool_result" for part in content
    )


def arguments(words: list[str]) -> list[str]:
    """A tool call's arguments in pieces, one a word: together, the JSON object
    ``{"input": "<the words>"}`` (``{}`` for no word)."""
    if not words:
        return ["{}"]
    pieces = [json.dumps(word)[1:-1] for word in words]
    pieces[0] = '{"input":"' + pieces[0]
    pieces[-1] += '"}'
    return pieces


def request_id(prefix: str = "req_") -> str:
    """A fresh id in the providers' style."""
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def now_seconds() -> int:
    """Unix time in whole seconds (the ``created`` field of OpenAI's objects)."""
    return int(time.time())


def rfc3339(offset: float = 0.0, precise: bool = False) -> str:
    """The UTC time ``offset`` seconds from now, as RFC 3339 (``precise``: with microseconds)."""
    moment = datetime.fromtimestamp(time.time() + offset, timezone.utc)
    if precise:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


async def write_stream(
    request: web.Request,
    response: web.StreamResponse,
    turn: Turn,
    pieces: Iterable[tuple[Part, bool]],
) -> web.StreamResponse:
    """Send the response's headers, then each piece; a piece marked as a token waits the
    profile's gap after the previous token, then is made (when it is a function) and sent. A
    client that hangs up is one log line, never an error: how many tokens it got of how many."""
    total = turn.output_tokens
    sent = 0
    try:
        await response.prepare(request)
        for data, token in pieces:
            if token and sent:
                await asyncio.sleep(turn.gap())
            await response.write(data() if callable(data) else data)
            sent += token
        await response.write_eof()
    except ConnectionResetError:  # aiohttp's ClientConnectionResetError too
        peer = request.remote or "the client"
        log.info(
            "%s hung up mid-stream: request %d got %d of %d chunks", peer, turn.number, sent, total
        )
    finally:
        turn.release()
    return response


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    """One Server-Sent Event holding ``data`` as JSON (with an ``event:`` line when named)."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
