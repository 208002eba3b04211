"""The ``small-prompts-one-by-one`` rule: many small prompts sent one after another, each
paying the request's fixed cost (the network's round trip, the provider's own start) for a few
tokens; merged, they pay it once.

A run is at least :data:`BATCH_MIN_REQUESTS` calls to one endpoint, each small and each soon
after the last one ended. Each call's fixed cost is what it took beyond its tokens, read with
the endpoint's own baselines (:mod:`~llm_latency.diagnosis.baselines`). The saving counts only
the provider's own start, what merging alone removes: the wait for a pooled connection, the
connection's set-up and the loop's hold are the seconds of ``pool-queue``, the connection rules,
``event-loop-lag`` and ``short-of-cpu``, whose fixes remove them without merging; the network's
overhead is ``network-overhead``'s (merging removes round trips, a nearer region shortens each:
one finding counts them), and a queue at the provider ``provider-queue``'s, which a merged request
waits in too (two findings never claim the same seconds: :mod:`~llm_latency.diagnosis.claims`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

from llm_latency.diagnosis import claims
from llm_latency.diagnosis.baselines import (
    FirstTokenModel,
    by_endpoint,
    decode_baseline,
    first_token_model,
    slope,
    this_side,
)
from llm_latency.diagnosis.findings import Finding, Saving, duration, percentile
from llm_latency.diagnosis.measured import answered, total
from llm_latency.diagnosis.records import Attempt, Call
from llm_latency.diagnosis.tokens import LONG_ANSWER_MIN_TOKENS, p50, token_evidence

#: small-prompts-one-by-one: at least this many calls, one after another...
BATCH_MIN_REQUESTS: Final = 8
#: ... each starting at most this long (s) after the last one ended...
BATCH_MAX_GAP: Final = 0.25
#: ... each with at most this many input tokens and this many output tokens...
BATCH_MAX_INPUT_TOKENS: Final = 500
BATCH_MAX_OUTPUT_TOKENS: Final = 100
#: ... and the requests' fixed cost at least this share of their time. (A merged request asks
#: for fewer than ``LONG_ANSWER_MIN_TOKENS`` output tokens: merging makes no long answer.)
BATCH_MIN_FIXED_SHARE: Final = 0.5
#: The fix says what the saving leaves out of the fixed cost when it is this much (s) at p50.
LEFT_OUT_SAID: Final = 0.001


def _small(attempt: Attempt) -> bool:
    return (
        attempt.input_tokens is not None
        and attempt.output_tokens is not None
        and attempt.input_tokens <= BATCH_MAX_INPUT_TOKENS
        and attempt.output_tokens <= BATCH_MAX_OUTPUT_TOKENS
    )


def _runs(group: Sequence[Attempt]) -> list[list[Attempt]]:
    """The group's small calls that went one after another, each soon after the last, in runs
    of at least :data:`BATCH_MIN_REQUESTS`."""
    runs: list[list[Attempt]] = []
    current: list[Attempt] = []
    for a in group:  # in start order
        if current:
            last = current[-1]
            gap = (a.start_ns - last.start_ns) / 1e9 - last.duration
            # (a microsecond of overlap is the rounding of two spans that touch)
            if not _small(a) or gap < -1e-6 or gap > BATCH_MAX_GAP:
                runs.append(current)
                current = []
        if _small(a):
            current.append(a)
    runs.append(current)
    return [run for run in runs if len(run) >= BATCH_MIN_REQUESTS]


def _fixed_costs(
    run: Sequence[Attempt], group: Sequence[Attempt], model: FirstTokenModel | None
) -> list[tuple[Attempt, float]]:
    """Each call's fixed cost, where known: what it took beyond its prompt's and its answer's
    tokens (its time to first token less the prompt's part, by the endpoint's ``model``; not
    streamed: its time less the answer's decode, from the server's decode time, else at the
    larger of a fit of the time against the output tokens and the endpoint's usual pace: the
    decode is never less than not-streamed counts)."""
    plain = [a for a in run if a.time_to_first_token is None]
    paces = [
        pace
        for pace in (slope([(float(a.output_tokens or 0), a.duration) for a in plain]),
                     decode_baseline(group))
        if pace is not None
    ]  # fmt: skip
    per = max(max(paces), 0.0) if paces else None
    costs = []
    for a in run:
        if a.time_to_first_token is not None:
            prompt = model.prompt_part(a) if model is not None else 0.0
            costs.append((a, max(a.time_to_first_token - prompt, 0.0)))
        elif a.server_decode is not None:
            costs.append((a, max(a.duration - a.server_decode, 0.0)))
        elif per is not None:
            costs.append((a, max(a.duration - per * (a.output_tokens or 0), 0.0)))
    return costs


def _merge_saves(attempt: Attempt, cost: float, model: FirstTokenModel | None) -> float:
    """What merging saves of ``attempt``'s fixed ``cost`` (s): not this side's queue, set-up
    and loop hold, nor the network's overhead, nor the provider's queue (reported, or beyond
    the endpoint's usual first token for a streamed answer). Those are their own findings'
    seconds: their fixes remove them without merging, and a merged request waits in the
    provider's queue too."""
    saves = cost - this_side(attempt) - (attempt.network_overhead or 0.0)
    saves -= attempt.server_queue or 0.0
    if attempt.time_to_first_token is not None and model is not None:
        saves = min(saves, max(model.base, 0.0))  # the usual provider's part, overhead out
    return max(saves, 0.0)


def _merged_away(runs: Sequence[Sequence[Attempt]], per_request: int) -> list[Attempt]:
    """The requests a merge of ``per_request`` prompts a request removes: in each run, all
    but the first of each ``per_request`` in a row."""
    return [a for run in runs for i, a in enumerate(run) if i % per_request]


def small_prompts_one_by_one(calls: Sequence[Call]) -> Finding | None:
    """Many small prompts sent one after another: each request pays its fixed cost (the
    network, the provider's own start) for a few tokens; merged, they pay it once."""
    attempts = answered(calls)
    runs: list[list[Attempt]] = []
    costs: list[float] = []
    saves: dict[int, float] = {}  # per attempt (by id), in the order of ``costs``
    for group in by_endpoint(attempts).values():
        model = first_token_model(group)
        for run in _runs(group):
            found = _fixed_costs(run, group, model)
            distinct = len({a.input_tokens for a in run}) > 1  # one request repeated: a probe
            fixed = sum(cost for _, cost in found) >= BATCH_MIN_FIXED_SHARE * total(run)
            if len(found) >= BATCH_MIN_REQUESTS and distinct and fixed:
                runs.append(run)
                costs += [cost for _, cost in found]
                saves.update((id(a), _merge_saves(a, cost, model)) for a, cost in found)
    if not runs:
        return None
    saved = list(saves.values())
    every = [a for run in runs for a in run]
    outputs = [float(a.output_tokens or 0) for a in every]
    inputs = [float(a.input_tokens or 0) for a in every]
    per_request = max(1, int(LONG_ANSWER_MIN_TOKENS // max(percentile(outputs, 95), 1.0)))
    per_request = min(per_request, max(len(run) for run in runs))
    if per_request < 2:
        return None
    merged = sum(math.ceil(len(run) / per_request) for run in runs)
    left_out = p50([cost - kept for cost, kept in zip(costs, saved, strict=True)])
    budget = math.ceil(per_request * max(outputs))
    return Finding(
        rule="small-prompts-one-by-one",
        cause=f"{len(every)} small prompts went one after another, each waiting for the last: "
        f"{p50(inputs):.0f} input and {p50(outputs):.0f} output tokens at p50, and "
        f"{duration(p50(costs))} of each request's {duration(p50([a.duration for a in every]))} "
        "was the request's own fixed cost, not its tokens",
        evidence=token_evidence("fixed cost per request", costs, attempts),
        fix=f"unless each needs the answer before it (an agent's steps), merge them, "
        f"{per_request} prompts a request (numbered items, one answer each, e.g. a JSON list): "
        f"{merged} request{'' if merged == 1 else 's'} of about "
        f"{per_request * p50(inputs):.0f} input and {per_request * p50(outputs):.0f} output "
        f"tokens instead of {len(every)}; set max_tokens to at least {budget} so no answer is "
        f"cut off (fewer than {LONG_ANSWER_MIN_TOKENS} output tokens a request keeps each "
        "answer short); or, when each must be a request of its own, send them concurrently "
        "(asyncio.gather, a thread pool) within the rate limits; work that can wait hours: "
        "the provider's batch API"
        + (
            f"; the saving leaves out the connections' set-up, the pool's queue, the loop's "
            f"hold, the network's overhead and the provider's queue ({duration(left_out)} a "
            "request at p50): the seconds of pool-queue, the connection rules, "
            "event-loop-lag, short-of-cpu, network-overhead and provider-queue, counted once, "
            "by them"
            if left_out >= LEFT_OUT_SAID
            else ""
        ),
        saving=Saving(p50(saved), percentile(saved, 95), len(every) - merged),
        claims=claims.per_attempt(
            claims.FIRST,
            [(a, saves[id(a)]) for a in _merged_away(runs, per_request) if id(a) in saves],
        ),
    )
