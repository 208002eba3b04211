"""What an endpoint usually does, from its own calls: the measures the token rules compare with.

The token rules (:mod:`~llm_latency.diagnosis.tokens`) never compare a call with a speed they
assume: each compares it with the same endpoint's other calls in the set given (the same host
and port, and the same model when the response names it). An endpoint with fewer than
:data:`BASELINE_MIN_REQUESTS` calls carrying the measure has no baseline, and a rule that needs
one says nothing. The baseline is a low percentile (:data:`BASELINE_PERCENTILE`) of the calls:
it stands for the endpoint's usual speed while a share of its calls is slow.

How the time to first token depends on the prompt's size is read with a Theil-Sen fit (the
median of the slopes between every two calls whose prompts differ by at least
:data:`FIT_MIN_STEP`): a few calls that queued do not tilt it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from llm_latency.diagnosis.findings import percentile
from llm_latency.diagnosis.records import SETUP_PHASES, Attempt

#: A baseline needs at least this many calls of the endpoint that carry the measure...
BASELINE_MIN_REQUESTS: Final = 4
#: ... and is this percentile of them (a low one: the endpoint's usual, not its slow calls).
BASELINE_PERCENTILE: Final = 25
#: A time per output token is read from answers of at least this many output tokens (fewer:
#: the first token's jitter is most of it).
RATE_MIN_TOKENS: Final = 10
#: Two calls give a slope only when their token counts differ by at least this share of the
#: larger.
FIT_MIN_STEP: Final = 0.1
#: A fit reads at most this many calls (evenly spread over the endpoint's calls), so that a
#: trace of thousands of calls is read in a moment.
FIT_MAX_POINTS: Final = 200

#: stream-stall: a pause between two chunks after the first token of at least this (s)...
STALL_MIN_GAP: Final = 1.0
#: ... and at least this many times the stream's mean gap after its first token.
STALL_MIN_RATIO: Final = 5.0

#: An endpoint: where the calls went (host, and port when the URL names one) and the model.
Endpoint = tuple[str, str]


def endpoint(attempt: Attempt) -> Endpoint:
    """The endpoint an attempt went to: ``("api.openai.com", "gpt-4o")``; the model is empty
    when the response does not name it."""
    where = attempt.host
    try:
        parts = urlsplit(attempt.url)
        if parts.hostname:
            where = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
    except ValueError:  # a URL with a port that is no number
        pass
    return where, attempt.model or ""


def named(key: Endpoint) -> str:
    """``api.openai.com (gpt-4o)``: an endpoint for people."""
    where, model = key
    return f"{where} ({model})" if model else where


def by_endpoint(chosen: Sequence[Attempt]) -> dict[Endpoint, list[Attempt]]:
    """The attempts per endpoint, in start order."""
    groups: dict[Endpoint, list[Attempt]] = {}
    for attempt in sorted(chosen, key=lambda a: a.start_ns):
        groups.setdefault(endpoint(attempt), []).append(attempt)
    return groups


def uncached(attempt: Attempt) -> int | None:
    """The prompt's tokens the provider had to read (not from its cache), when known."""
    if attempt.input_tokens is None:
        return None
    return max(attempt.input_tokens - (attempt.cached_tokens or 0), 0)


def first_token(attempt: Attempt) -> float | None:
    """The provider's time to the first token (s): the time to first token less what this side
    added before the provider could answer (the wait for a pooled connection, the connection's
    set-up, and the loop's hold while sending and waiting: :func:`this_side`) and the network's
    overhead; None when not streamed."""
    if attempt.time_to_first_token is None:
        return None
    return max(
        attempt.time_to_first_token - this_side(attempt) - (attempt.network_overhead or 0.0), 0.0
    )


def this_side(attempt: Attempt) -> float:
    """What this side added to the attempt before the provider could answer (s): the wait for
    a pooled connection, the connection's set-up, and the loop's hold while sending and
    waiting (:attr:`~llm_latency.diagnosis.model.Phase.held`); the seconds ``pool-queue``, the
    connection rules, ``event-loop-lag`` and ``short-of-cpu`` count."""
    own = sum(p.duration for p in attempt.phases if p.name == "queue" or p.name in SETUP_PHASES)
    return own + sum(p.held for p in attempt.phases if p.name in ("send", "wait"))


def per_token(attempt: Attempt) -> tuple[float, bool] | None:
    """Seconds per output token, and whether that is only an upper bound: measured on the
    stream (the loop's hold while reading it, the program's stall and the machine's wait for a
    CPU, and the stream's pause beyond its mean gap, :func:`stream_pause`, taken off), else the
    server's own decode time over the tokens, else (an answer not streamed) the server's whole
    time over them, which includes the prompt's. None when not known."""
    output = attempt.output_tokens
    if attempt.time_per_output_token is not None:
        stall = sum(p.held for p in attempt.phases if p.name == "receive")
        pause = stream_pause(attempt)  # stream-stall's seconds, no pace of the provider's
        if pause is not None:
            stall += pause[0] - pause[1]
        stalled = stall / (output - 1) if output and output > 1 else 0.0
        return max(attempt.time_per_output_token - stalled, 0.0), False
    if attempt.server_decode is not None and output:
        return attempt.server_decode / output, False
    if attempt.server_time_per_output_token_max is not None:
        return attempt.server_time_per_output_token_max, True
    return None


def stream_pause(attempt: Attempt) -> tuple[float, float] | None:
    """The stream's pause, ``stream-stall``'s: its longest gap after the first token (the
    program's own loop stall in it taken off) and its mean gap then (s), when the gap is at
    least :data:`STALL_MIN_GAP` and :data:`STALL_MIN_RATIO` times the mean; else None."""
    gap, events = attempt.stream_max_gap, attempt.stream_events
    receive = attempt.phase("receive")
    if gap is None or not events or receive is None or gap < STALL_MIN_GAP:
        return None
    first = attempt.time_to_first_token
    streamed = attempt.duration - first if first is not None else receive
    mean = max(streamed, 0.0) / max(events, 1)
    return (gap, mean) if gap >= STALL_MIN_RATIO * mean else None


def measured_rate(attempt: Attempt) -> float | None:
    """Seconds per output token when measured (not a bound), on an answer long enough to tell
    (:data:`RATE_MIN_TOKENS`)."""
    rate = per_token(attempt)
    if rate is None or rate[1] or rate[0] <= 0 or (attempt.output_tokens or 0) < RATE_MIN_TOKENS:
        return None
    return rate[0]


def decode_baseline(group: Sequence[Attempt]) -> float | None:
    """The endpoint's usual time per output token (s), or None without enough measured calls."""
    rates = [r for a in group if (r := measured_rate(a)) is not None]
    if len(rates) < BASELINE_MIN_REQUESTS:
        return None
    return percentile(rates, BASELINE_PERCENTILE)


def _spread(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(points) <= FIT_MAX_POINTS:
        return list(points)
    step = len(points) / FIT_MAX_POINTS
    return [points[int(i * step)] for i in range(FIT_MAX_POINTS)]


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """The Theil-Sen slope of ``(x, y)`` points: the median of the slopes between every two
    whose ``x`` differ by at least :data:`FIT_MIN_STEP` of the larger; None when no two do."""
    chosen = _spread(points)
    slopes = [
        (y2 - y1) / (x2 - x1)
        for i, (x1, y1) in enumerate(chosen)
        for x2, y2 in chosen[i + 1 :]
        if x2 != x1 and abs(x2 - x1) >= FIT_MIN_STEP * max(abs(x1), abs(x2))
    ]
    return percentile(slopes, 50) if slopes else None


@dataclass(frozen=True)
class FirstTokenModel:
    """An endpoint's usual time to first token: ``base`` (s) plus ``per_token`` (s) for each
    prompt token it had to read; ``fitted``: the prompts' sizes varied enough to measure
    ``per_token`` (else it is 0); ``spread``: the largest prompt over the smallest."""

    base: float
    per_token: float
    fitted: bool
    spread: float

    def expected(self, attempt: Attempt) -> float:
        """The usual time to first token for a prompt of ``attempt``'s size (s)."""
        return max(self.base, 0.0) + self.per_token * (uncached(attempt) or 0)

    def prompt_part(self, attempt: Attempt) -> float:
        """The share of the time to first token the prompt's size accounts for (s)."""
        return self.per_token * (uncached(attempt) or 0)


def first_token_model(group: Sequence[Attempt]) -> FirstTokenModel | None:
    """The endpoint's :class:`FirstTokenModel`, from its streamed calls whose time to first
    token (:func:`first_token`) and prompt tokens are known; None with fewer than
    :data:`BASELINE_MIN_REQUESTS`."""
    points = [
        (float(x), y)
        for a in group
        if (y := first_token(a)) is not None and (x := uncached(a)) is not None
    ]
    if len(points) < BASELINE_MIN_REQUESTS:
        return None
    fitted = slope(points)
    per = max(fitted, 0.0) if fitted is not None else 0.0
    residuals = [y - per * x for x, y in points]
    sizes = [x for x, _ in points]
    spread = max(sizes) / max(min(sizes), 1.0)
    return FirstTokenModel(
        percentile(residuals, BASELINE_PERCENTILE), per, fitted is not None and per > 0, spread
    )
