"""What every API of the mock server shares: the latency profile, the running state, one
request's turn (its number, its scripted failure, its words) and the paced writing of a stream.

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

#: The prompt's token count every API reports (the mock does not tokenize).
PROMPT_TOKENS = 8


@dataclass
class Profile:
    """How the mock server behaves.

    ``ttfb``: seconds before the first byte of an answer (a streamed one's first token);
    ``tokens_per_second`` and ``tokens``: the answer's pace and length; every
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


@dataclass
class ServerState:
    """The mock server's running state; ``rate_limit_next`` makes the next N requests 429."""

    profile: Profile
    counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    rng: random.Random = field(default_factory=random.Random)
    rate_limit_next: int = 0


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
        return [f"token{i} " for i in range(self.profile.tokens)]

    def generation(self) -> float:
        """Seconds the whole answer takes to generate at the profile's pace."""
        return self.profile.tokens / max(self.profile.tokens_per_second, 1e-3)

    def gap(self) -> float:
        """Seconds between two tokens of a stream."""
        return 1.0 / max(self.profile.tokens_per_second, 1e-3)

    def retry_after_seconds(self) -> str:
        """``retry-after`` in whole seconds (at least 1) for the profile's ``retry_after_ms``."""
        return str(max(1, round(self.profile.retry_after_ms / 1000)))

    async def answer(self, stream: bool) -> None:
        """Wait as the provider would before its response headers: the time to the first byte,
        and for an answer that is not streamed, its whole generation."""
        await asyncio.sleep(self.profile.ttfb + (0.0 if stream else self.generation()))


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
    return Turn(state, number, arrived, body, failure)


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
    total = turn.profile.tokens
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
    return response


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    """One Server-Sent Event holding ``data`` as JSON (with an ``event:`` line when named)."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
