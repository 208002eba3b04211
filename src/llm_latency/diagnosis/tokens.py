"""The token rules: what the answers' tokens say of the provider's time.

An attempt whose response carried usage says how many tokens went each way and, measured on
the stream (or bounded by the server's time when not streamed), how fast they came. Each rule
compares the calls with their endpoint's own baseline (:mod:`~llm_latency.diagnosis.baselines`):

- ``long-answer``: the answers are long: generating their tokens is most of the time;
- ``long-prompt``: the time to first token grows with the prompt's tokens, and long prompts
  make most of it;
- ``provider-queue``: the first token came far later than the endpoint's own calls with
  prompts of that size, the tokens then at the usual pace (or the provider says it queued);
- ``slow-generation``: the tokens came far slower than the endpoint's usual pace;

and, in :mod:`~llm_latency.diagnosis.one_by_one`, ``small-prompts-one-by-one``: many small
prompts sent one after another, each paying the request's fixed cost.

A token finding says why the provider took its time: ``server-time`` (the provider's time,
without the tokens' reason) and, for long answers, ``not-streamed`` (the same seconds, seen from
the first byte) yield to it (:data:`SUPERSEDED`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from llm_latency.diagnosis import claims
from llm_latency.diagnosis.baselines import (
    BASELINE_PERCENTILE,
    by_endpoint,
    decode_baseline,
    first_token,
    first_token_model,
    measured_rate,
    named,
    per_token,
    uncached,
)
from llm_latency.diagnosis.findings import Evidence, Finding, Saving, duration, percent, percentile
from llm_latency.diagnosis.measured import MIN_REQUESTS, answered, total
from llm_latency.diagnosis.records import Attempt, Call

#: long-answer: answers of at least this many output tokens...
LONG_ANSWER_MIN_TOKENS: Final = 300
#: ... whose generation takes at least this (s) at p50...
LONG_ANSWER_MIN_DECODE: Final = 1.0
#: ... and at least this share of their requests' time.
LONG_ANSWER_MIN_SHARE: Final = 0.5
#: long-prompt: prompts of at least this many tokens the provider had to read (not cached)...
LONG_PROMPT_MIN_TOKENS: Final = 1000
#: ... whose part of the time to first token is at least this (s) at p50...
LONG_PROMPT_MIN_TIME: Final = 0.3
#: ... and at least this share of it; the endpoint's prompts vary by this factor at least.
LONG_PROMPT_MIN_SHARE: Final = 0.5
LONG_PROMPT_MIN_SPREAD: Final = 2.0
#: provider-queue: a first token at least this many times the endpoint's usual for the
#: prompt's size...
PROVIDER_QUEUE_MIN_RATIO: Final = 3.0
#: ... and at least this much later (s), or a queue time the provider reports of this much...
PROVIDER_QUEUE_MIN_EXCESS: Final = 0.25
#: ... on at least this share of the time.
PROVIDER_QUEUE_MIN_SHARE: Final = 0.1
#: slow-generation: a time per output token at least this many times the endpoint's usual...
SLOW_GENERATION_MIN_RATIO: Final = 3.0
#: ... costing at least this (s) more per answer, on at least this share of the time.
SLOW_GENERATION_MIN_EXCESS: Final = 0.25
SLOW_GENERATION_MIN_SHARE: Final = 0.1
#: The findings that yield to a token finding (left out when one of these is there): they
#: describe the same seconds of the provider's time without saying why.
SUPERSEDED: Final = {
    "server-time": ("long-answer", "long-prompt", "provider-queue", "slow-generation"),
    "not-streamed": ("long-answer",),
}


def without_superseded(findings: Sequence[Finding]) -> list[Finding]:
    """``findings`` less those a token finding stands in for (:data:`SUPERSEDED`)."""
    present = {f.rule for f in findings}
    return [f for f in findings if not present & set(SUPERSEDED.get(f.rule, ()))]


def token_evidence(phase: str, values: Sequence[float], attempts: Sequence[Attempt]) -> Evidence:
    """A token rule's evidence: ``values`` (s, one per request it concerns) and their share of
    the ``attempts``' time, at least :data:`MIN_REQUESTS` of them needed."""
    share = min(sum(values) / total(attempts), 1.0)
    return Evidence.of(phase, values, share, len(attempts), needed=MIN_REQUESTS)


def p50(values: Sequence[float]) -> float:
    """The median of ``values`` (NaN when empty)."""
    return percentile(values, 50)


def long_answer(calls: Sequence[Call]) -> Finding | None:
    """Long answers: generating their tokens is most of their time, the answers' length, not a
    slow provider. A shorter answer saves its tokens at its pace; where ``slow-generation``
    finds the answer slow, at the endpoint's usual pace (the time beyond is that finding's)."""
    attempts = answered(calls)
    chosen: list[tuple[Attempt, int, float, bool]] = []
    for a in attempts:
        known = per_token(a)
        if known is not None and a.output_tokens and a.output_tokens >= LONG_ANSWER_MIN_TOKENS:
            chosen.append((a, a.output_tokens, known[0], known[1]))
    decode = [output * rate for _, output, rate, _ in chosen]
    if len(chosen) < MIN_REQUESTS or p50(decode) < LONG_ANSWER_MIN_DECODE:
        return None
    if sum(decode) < LONG_ANSWER_MIN_SHARE * total([a for a, *_ in chosen]):
        return None
    rate = p50([r for *_, r, _ in chosen])
    bound = any(b for *_, b in chosen)
    pace = (
        f"{duration(rate)} per token or less (the server's time over its output tokens: an "
        "upper bound, the prompt's time included)"
        if bound
        else f"{duration(rate)} per token ({1 / max(rate, 1e-9):.0f} tokens/s)"
    )
    # The answers that came slowly: their time beyond the endpoint's usual pace is
    # slow-generation's; a shorter answer saves its tokens at the usual pace.
    slow = generated_slowly(attempts)
    usual = {id(a): endpoint_rate for a, _, endpoint_rate, _ in slow[0]} if slow else {}
    halved = [output / 2 * usual.get(id(a), r) for a, output, r, _ in chosen]
    fix = (
        "ask for a shorter answer (say so in the prompt: a length, a terser format) and cap it "
        "with max_tokens (OpenAI's chat API: max_completion_tokens; its Responses API: "
        f"max_output_tokens): each output token costs {duration(rate)}, so answers half as "
        "long save half of it"
    )
    if slowed := [usual[id(a)] for a, *_ in chosen if id(a) in usual]:
        fix += (
            f"; the {len(slowed)} that came slowly save theirs at the endpoint's usual "
            f"{duration(p50(slowed))} per token (slow-generation counts the time beyond it)"
        )
    if not all(a.streamed for a, *_ in chosen):
        fix += "; stream them (stream=True) so the first tokens show before the whole answer"
    return Finding(
        rule="long-answer",
        cause=f"{len(chosen)} answers were long: {p50([o for _, o, *_ in chosen]):.0f} output "
        f"tokens at p50, generated at {pace}: {duration(p50(decode))} of each request",
        evidence=token_evidence("decode (output tokens)", decode, attempts),
        fix=fix,
        saving=Saving(p50(halved), percentile(halved, 95), len(chosen)),
        claims=claims.per_attempt(
            claims.DECODE, [(a, h) for (a, *_), h in zip(chosen, halved, strict=True)]
        ),
    )


def _cache_state(chosen: Sequence[Attempt]) -> str:
    known = [a for a in chosen if a.cached_tokens is not None]
    if not known:
        return "the provider did not say how many prompt tokens came from its cache"
    cached = sum(a.cached_tokens or 0 for a in known)
    if not cached:
        return f"none of the prompt tokens came from the cache ({len(known)} answers said)"
    share = cached / max(sum(a.input_tokens or 0 for a in known), 1)
    return f"{percent(share)} of the prompt tokens came from the cache"


def long_prompt(calls: Sequence[Call]) -> Finding | None:
    """The time to first token grows with the prompt's tokens, and long prompts make most of
    it: the provider reads every token of the prompt before it writes the first of the answer."""
    attempts = answered(calls)
    chosen: list[tuple[Attempt, float, float]] = []  # the attempt, the prompt's part, its whole
    for group in by_endpoint(attempts).values():
        model = first_token_model(group)
        fit = model is not None and model.fitted and model.spread >= LONG_PROMPT_MIN_SPREAD
        for a in group:
            if (uncached(a) or 0) < LONG_PROMPT_MIN_TOKENS:
                continue
            first = first_token(a)
            whole = first if first is not None else a.duration
            if a.server_prefill is not None:
                chosen.append((a, a.server_prefill, whole))
            elif fit and model is not None and first is not None:
                chosen.append((a, min(model.prompt_part(a), whole), whole))
    parts = [part for _, part, _ in chosen]
    if len(chosen) < MIN_REQUESTS or p50(parts) < LONG_PROMPT_MIN_TIME:
        return None
    if sum(parts) < LONG_PROMPT_MIN_SHARE * sum(whole for *_, whole in chosen):
        return None
    prompts = [float(uncached(a) or 0) for a, *_ in chosen]
    per_1000 = p50([part / max(p, 1.0) * 1000 for part, p in zip(parts, prompts, strict=True)])
    halved = [part / 2 for part in parts]
    taken = claims.per_attempt(
        claims.FIRST, [(a, h) for (a, *_), h in zip(chosen, halved, strict=True)]
    )
    return Finding(
        rule="long-prompt",
        cause=f"{len(chosen)} prompts were long: {p50(prompts):.0f} tokens at p50 that the "
        f"provider had to read before the first token of the answer, "
        f"{duration(per_1000)} per 1000 tokens: "
        f"{duration(p50(parts))} of the {duration(p50([w for *_, w in chosen]))} to the "
        "first token at p50; the time to first token grows with the prompt",
        evidence=token_evidence("prefill (prompt tokens)", parts, attempts),
        fix="trim the prompt (older turns of the conversation, fewer or shorter retrieved "
        "passages, instructions said once) and cache its stable prefix: OpenAI caches prompts "
        "of 1024 tokens or more by itself when they begin alike (fixed instructions and "
        "context first, what changes last), Anthropic only what `cache_control` marks (on "
        f"the last block of the fixed part); {_cache_state([a for a, *_ in chosen])}; a "
        "prompt half as long saves half of its part",
        saving=Saving(p50(halved), percentile(halved, 95), len(chosen)),
        claims=taken,
    )


def _normal_decode(attempt: Attempt, usual: float | None) -> bool:
    rate = measured_rate(attempt)
    return rate is None or usual is None or rate < SLOW_GENERATION_MIN_RATIO * usual


def provider_queue(calls: Sequence[Call]) -> Finding | None:
    """The first token came far later than the endpoint's own calls with prompts of that size,
    the tokens then at the usual pace: the request waited in the provider's queue."""
    attempts = answered(calls)
    queued: list[tuple[Attempt, float, float]] = []  # the attempt, the excess, its usual
    reported = 0
    hosts: set[str] = set()
    for key, group in by_endpoint(attempts).items():
        model = first_token_model(group)
        usual_rate = decode_baseline(group)
        for a in group:
            if a.server_queue is not None:  # the provider says it
                if a.server_queue >= PROVIDER_QUEUE_MIN_EXCESS:
                    usual = max((first_token(a) or 0.0) - a.server_queue, 0.0)
                    queued.append((a, min(a.server_queue, claims.room(a, claims.FIRST)), usual))
                    reported += 1
                    hosts.add(named(key))
                continue
            first = first_token(a)
            if model is None or first is None or uncached(a) is None:
                continue
            usual = model.expected(a)
            if (
                first < PROVIDER_QUEUE_MIN_RATIO * usual
                or first - usual < PROVIDER_QUEUE_MIN_EXCESS
            ):
                continue
            if _normal_decode(a, usual_rate):  # else: slow-generation's, the whole answer slow
                queued.append((a, min(first - usual, claims.room(a, claims.FIRST)), usual))
                hosts.add(named(key))
    excess = [e for _, e, _ in queued]
    if len(queued) < MIN_REQUESTS or sum(excess) < PROVIDER_QUEUE_MIN_SHARE * total(attempts):
        return None
    firsts = [  # after sending: the network's overhead back in
        f + (a.network_overhead or 0.0) for a, *_ in queued if (f := first_token(a)) is not None
    ]
    against = (
        f"the provider reported {duration(p50([a.server_queue or 0.0 for a, *_ in queued]))} "
        "of queue time at p50"
        if reported == len(queued)
        else f"against {duration(p50([u for *_, u in queued]))} usual for prompts of that size "
        f"on the same endpoint (the {BASELINE_PERCENTILE}th percentile of its calls, after "
        "the prompt's part)"
    )
    waited = (
        f"got their first token {duration(p50(firsts))} after sending at p50, " if firsts else ""
    )
    return Finding(
        rule="provider-queue",
        cause=f"{len(queued)} of {len(attempts)} requests to {', '.join(sorted(hosts))} "
        f"{waited}{against}, the tokens then coming at the usual pace: the provider's queue at "
        "that time",
        evidence=token_evidence("first token (beyond the usual)", excess, attempts),
        fix="the provider queued the requests at that time: send them to another region or "
        "deployment of the model, buy provisioned (reserved) throughput, or run work that can "
        "wait off-peak; confirm with `llm-latency watch` on the endpoint, whose probes wait "
        "too when it is the provider's queue (a server of one's own: more replicas, or fewer "
        "requests at once)",
        saving=Saving(p50(excess), percentile(excess, 95), len(queued)),
        claims=claims.per_attempt(claims.FIRST, [(a, e) for a, e, _ in queued]),
    )


#: An answer that came slowly: the attempt, its time per output token, the endpoint's usual one,
#: and the time beyond the usual (s).
Slow = tuple[Attempt, float, float, float]


def generated_slowly(attempts: Sequence[Attempt]) -> tuple[list[Slow], set[str]] | None:
    """The answers ``slow-generation`` finds slow and their endpoints, or None when it does not
    apply: tokens at least :data:`SLOW_GENERATION_MIN_RATIO` times slower than the endpoint's
    usual pace, each losing at least :data:`SLOW_GENERATION_MIN_EXCESS`, enough of them."""
    slow: list[Slow] = []
    hosts: set[str] = set()
    for key, group in by_endpoint(attempts).items():
        usual = decode_baseline(group)
        if usual is None:
            continue
        for a in group:
            rate = measured_rate(a)
            if rate is None or rate < SLOW_GENERATION_MIN_RATIO * usual:
                continue
            excess = (rate - usual) * max((a.output_tokens or 1) - 1, 1)
            if excess >= SLOW_GENERATION_MIN_EXCESS:
                slow.append((a, rate, usual, excess))
                hosts.add(named(key))
    lost = [e for *_, e in slow]
    if len(slow) < MIN_REQUESTS or sum(lost) < SLOW_GENERATION_MIN_SHARE * total(attempts):
        return None
    return slow, hosts


def slow_generation(calls: Sequence[Call]) -> Finding | None:
    """The tokens came far slower than the endpoint's usual pace: the provider generated
    slowly at that time."""
    attempts = answered(calls)
    found = generated_slowly(attempts)
    if found is None:
        return None
    slow, hosts = found
    lost = [e for *_, e in slow]
    rate, usual = p50([r for _, r, _, _ in slow]), p50([u for _, _, u, _ in slow])
    return Finding(
        rule="slow-generation",
        cause=f"{len(slow)} of {len(attempts)} answers from {', '.join(sorted(hosts))} came at "
        f"{duration(rate)} per output token at p50 ({1 / rate:.0f} tokens/s), against the "
        f"endpoint's usual {duration(usual)} ({1 / usual:.0f} tokens/s, the "
        f"{BASELINE_PERCENTILE}th percentile of its calls): the provider generated slowly at "
        "that time",
        evidence=token_evidence("decode (beyond the usual)", lost, attempts),
        fix="another region or deployment of the model, or a smaller, faster model for this "
        "task; confirm with `llm-latency watch` on the endpoint, whose inference probes slow "
        "down too when it is the provider, and report it with the request ids if it lasts",
        saving=Saving(p50(lost), percentile(lost, 95), len(slow)),
        claims=claims.per_attempt(claims.DECODE, [(a, e) for a, *_, e in slow]),
    )
