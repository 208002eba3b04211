"""The diagnosis rules: each reads finished calls and returns a finding, or None when it does
not apply. Every threshold is a named constant here (or in the modules of the failure rules, of
the token rules and of the measures) and listed in docs/diagnosis.md.

The latency rules read only the attempts that succeeded (failures have rules of their own, in
:mod:`~llm_latency.diagnosis.failures`), and the network rules read each phase without the
program's own event-loop stall (``Phase.net``). Shares are of the attempts' summed duration;
percentiles are over the requests a rule concerns; a finding needs at least
:data:`~llm_latency.diagnosis.measured.MIN_REQUESTS` of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from llm_latency import semconv
from llm_latency.diagnosis import claims, failures, one_by_one, tokens
from llm_latency.diagnosis.baselines import (
    STALL_MIN_GAP,
    STALL_MIN_RATIO,
    by_endpoint,
    decode_baseline,
    endpoint,
    stream_pause,
    this_side,
)
from llm_latency.diagnosis.connections import (
    NEW_CONNECTION_MIN_SETUP,
    NEW_CONNECTION_MIN_SHARE,
    SLOW_CONNECT,
    new_connections,
    slow_connect,
)
from llm_latency.diagnosis.dns import SLOW_DNS, slow_dns
from llm_latency.diagnosis.findings import Evidence, Finding, Saving, duration, percentile
from llm_latency.diagnosis.measured import MIN_REQUESTS, answered
from llm_latency.diagnosis.measured import total as _total
from llm_latency.diagnosis.pool import QUEUE_MIN_SHARE, QUEUE_MIN_WAIT, pool_queue
from llm_latency.diagnosis.rate_limits import rate_limits
from llm_latency.diagnosis.records import Attempt, Call
from llm_latency.diagnosis.stream_limit import http2_stream_limit
from llm_latency.timeline import WAIT

#: server-time: the provider's own time is at least this (s) at p50...
SERVER_MIN_TIME: Final = 0.5
#: ... at least this share of ``http.wait``...
SERVER_MIN_SHARE_OF_WAIT: Final = 0.8
#: ... and ``http.wait`` at least this share of the attempts' time.
WAIT_MIN_SHARE: Final = 0.5
#: network-overhead: the overhead p50 at least this (s)...
OVERHEAD_MIN: Final = 0.05
#: ... and at least this share of the wait's p50.
OVERHEAD_MIN_SHARE_OF_WAIT: Final = 0.2
#: not-streamed: a non-streamed answer whose wait p50 is at least this (s)...
NOT_STREAMED_MIN_WAIT: Final = 1.0
#: ... and at least this share of the attempt.
NOT_STREAMED_MIN_SHARE: Final = 0.6
#: event-loop-lag: the program's loop held at least two requests back at least this (s), and
#: this at p50...
LAG_MIN: Final = 0.05
#: ... and for at least this share of the attempts' time.
LAG_MIN_SHARE: Final = 0.1
#: A phase whose time was at least this share the program's own stall is "mostly lag".
MOSTLY_LAG: Final = 0.5

__all__ = [
    "NEW_CONNECTION_MIN_SETUP",
    "NEW_CONNECTION_MIN_SHARE",
    "QUEUE_MIN_SHARE",
    "QUEUE_MIN_WAIT",
    "RULES",
    "SLOW_CONNECT",
    "SLOW_DNS",
    "STALL_MIN_GAP",
    "STALL_MIN_RATIO",
    "new_connections",
    "pool_queue",
    "slow_connect",
    "slow_dns",
]

Rule = Callable[[Sequence[Call]], "Finding | None"]


def _attempts(calls: Sequence[Call]) -> list[Attempt]:
    return answered(calls)


def _evidence(phase: str, values: Sequence[float], share: float, requests: int) -> Evidence:
    return Evidence.of(phase, values, share, requests, needed=MIN_REQUESTS)


def server_time(calls: Sequence[Call]) -> Finding | None:
    """The provider's own processing is most of the wait: the model's time, not the network's."""
    attempts = [
        a
        for a in _attempts(calls)
        if a.succeeded and a.server_processing is not None and a.phase("wait")
    ]
    if not attempts:
        return None
    server = [a.server_processing or 0.0 for a in attempts]
    waits = [a.net("wait") or 0.0 for a in attempts]
    if percentile(server, 50) < SERVER_MIN_TIME:
        return None
    if sum(server) < SERVER_MIN_SHARE_OF_WAIT * sum(waits):
        return None
    if sum(waits) < WAIT_MIN_SHARE * _total(attempts):
        return None
    evidence = _evidence("server processing", server, sum(server) / _total(attempts), len(attempts))
    streamed = all(a.streamed for a in attempts)
    inputs = [a.input_tokens for a in attempts if a.input_tokens is not None]
    outputs = [a.output_tokens for a in attempts if a.output_tokens is not None]
    sizes = (
        f" (prompts of {percentile(inputs, 50):.0f} tokens, answers of "
        f"{percentile(outputs, 50):.0f} at p50)"
        if inputs and outputs
        else ""
    )
    fix = "a faster model, a shorter prompt or a lower max_tokens shorten it"
    if not streamed:
        fix += "; streaming brings the first token sooner"
    return Finding(
        rule="server-time",
        cause=f"the provider spent {duration(evidence.p50)} at p50 processing each request: "
        f"{sum(server) / sum(waits) * 100:.0f}% of the wait for the first byte{sizes}",
        evidence=evidence,
        fix=fix,
        saving=None,
    )


def network_overhead(calls: Sequence[Call]) -> Finding | None:
    """Time to the first byte that the server's own time does not explain."""
    attempts = [a for a in _attempts(calls) if a.network_overhead is not None]
    overheads = [a.network_overhead or 0.0 for a in attempts]
    waits = [a.net("wait") or 0.0 for a in attempts]
    if not attempts or percentile(overheads, 50) < OVERHEAD_MIN:
        return None
    if percentile(overheads, 50) < OVERHEAD_MIN_SHARE_OF_WAIT * percentile(waits, 50):
        return None
    evidence = _evidence(
        "network overhead", overheads, sum(overheads) / _total(attempts), len(attempts)
    )
    return Finding(
        rule="network-overhead",
        cause=f"{duration(evidence.p50)} at p50 of each request's wait is neither the server's "
        "processing nor this program: the network and the provider's edge",
        evidence=evidence,
        fix="use a region or edge nearer this program; compare endpoints side by side with "
        "`llm-latency probe URL1 URL2`",
        saving=Saving(evidence.p50, evidence.p95, len(attempts)),
        claims=claims.per_attempt(claims.OVERHEAD, zip(attempts, overheads, strict=True)),
    )


def not_streamed(calls: Sequence[Call]) -> Finding | None:
    """A long answer read in one piece: streaming would show its first token much sooner."""
    attempts = [a for a in _attempts(calls) if a.succeeded and not a.streamed]
    waits = [a.phase("wait") or 0.0 for a in attempts]
    if not attempts or percentile(waits, 50) < NOT_STREAMED_MIN_WAIT:
        return None
    if sum(waits) < NOT_STREAMED_MIN_SHARE * _total(attempts):
        return None
    evidence = _evidence(
        semconv.PHASE_SPAN_NAMES[WAIT], waits, sum(waits) / _total(_attempts(calls)), len(attempts)
    )
    streamed = [a for a in _attempts(calls) if a.time_to_first_chunk is not None and a.succeeded]
    saving = None
    ahead: list[tuple[Attempt, float]] = []
    how = "measure the first chunk with `llm-latency probe --stream`"
    if streamed:
        first = percentile([a.time_to_first_chunk or 0.0 for a in streamed], 50)
        ahead = _shown_sooner(attempts, streamed, _attempts(calls))
        shown = [seconds for _, seconds in ahead]
        if any(shown):
            saving = Saving(percentile(shown, 50), percentile(shown, 95), len(attempts))
        how = f"streamed requests here had their first chunk after {duration(first)} at p50"
    return Finding(
        rule="not-streamed",
        cause=f"{len(attempts)} answers were not streamed: nothing arrived for "
        f"{duration(evidence.p50)} at p50, until the whole answer was ready",
        evidence=evidence,
        fix=f"stream the response (stream=True) to show the first tokens early; {how}",
        saving=saving,
        claims=claims.per_attempt(claims.ANSWER, ahead),
    )


def _shown_sooner(
    whole: Sequence[Attempt], streamed: Sequence[Attempt], every: Sequence[Attempt]
) -> list[tuple[Attempt, float]]:
    """How much sooner each answer read ``whole`` would show its first tokens if streamed (s).

    Its provider's part (:data:`~llm_latency.diagnosis.claims.ANSWER`: this side's time and
    the network overhead come first, streamed or not) after the ``streamed`` answers' first
    chunk at p50 (the same left out), or after the provider's own queue and prefill when it
    says them and they are more; at most the answer's decode when known (the server's decode
    time, else its tokens at the endpoint's usual pace among ``every`` answer): the rest of a
    short answer's time is its request's fixed cost. Less the time beyond the usual pace,
    which ``slow-generation`` claims."""
    first = percentile(
        [max((a.time_to_first_chunk or 0.0) - this_side(a) - (a.network_overhead or 0.0), 0.0)
         for a in streamed],
        50,
    )  # fmt: skip
    found = tokens.generated_slowly(every)
    beyond = {id(a): excess for a, *_, excess in found[0]} if found else {}
    paces = {key: decode_baseline(group) for key, group in by_endpoint(every).items()}
    shown = []
    for a in whole:
        before = max(first, (a.server_queue or 0.0) + (a.server_prefill or 0.0))
        ahead = claims.layout(a).get(claims.ANSWER, 0.0) - before
        pace = paces.get(endpoint(a))
        if a.server_decode is not None:
            ahead = min(ahead, a.server_decode)
        elif pace is not None and a.output_tokens:
            ahead = min(ahead, pace * (a.output_tokens - 1))
        shown.append((a, max(ahead - beyond.get(id(a), 0.0), 0.0)))
    return shown


def stream_stall(calls: Sequence[Call]) -> Finding | None:
    """A stream that stopped for a long time between two chunks, after its first token: the
    wait before it (the provider's queue, the prompt's prefill, hidden reasoning after the
    control events) is ``provider-queue``'s and ``long-prompt``'s, and no pause of the stream
    (``llm_latency.stream.max_gap`` starts at the first token too); the stream's pace is its
    own after the first token."""
    attempts = _attempts(calls)
    stalls: list[float] = []
    usual: list[float] = []
    paused: list[Attempt] = []
    for attempt in attempts:
        pause = stream_pause(attempt)
        if pause is not None:
            stalls.append(pause[0])
            usual.append(pause[1])
            paused.append(attempt)
    if not stalls:
        return None
    evidence = Evidence.of("stream.max_gap", stalls, sum(stalls) / _total(attempts), len(attempts))
    lost = [gap - mean for gap, mean in zip(stalls, usual, strict=True)]
    return Finding(
        rule="stream-stall",
        cause=f"{len(stalls)} streams stopped for {duration(evidence.p50)} at p50 between two "
        f"chunks, where chunks came every {duration(percentile(usual, 50))} on average",
        evidence=evidence,
        fix="the provider paused mid-stream: set a read timeout that bounds the pause you "
        "accept and retry the call on it, or try another region or model; check the event-loop "
        "lag on the same requests, which would make it this program's pause",
        saving=Saving(percentile(lost, 50), percentile(lost, 95), len(stalls)),
        claims=claims.per_attempt(claims.DECODE, zip(paused, lost, strict=True)),
    )


def _lag_by_phase(attempts: Sequence[Attempt]) -> str:
    """Where the stall fell, when the phases say: ``most of it in connect and tls (280 ms of
    their 300 ms per request: mostly this program's stall, not the network)``; empty when not
    known."""
    lagged: dict[str, list[float]] = {}  # phase -> [lag, duration, requests]
    for attempt in attempts:
        for phase in attempt.phases:
            if phase.lag:
                sums = lagged.setdefault(phase.name, [0.0, 0.0, 0.0])
                sums[0] += phase.lag
                sums[1] += phase.duration
                sums[2] += 1
    if not lagged:
        return ""
    every = sum(sums[0] for sums in lagged.values())
    chosen: list[str] = []
    for name in sorted(lagged, key=lambda n: -lagged[n][0]):  # the phases holding most of it
        chosen.append(name)
        if sum(lagged[n][0] for n in chosen) >= 0.5 * every:
            break
    lag = sum(lagged[n][0] / lagged[n][2] for n in chosen)
    whole = sum(lagged[n][1] / lagged[n][2] for n in chosen)
    their = "its" if len(chosen) == 1 else "their"
    text = (
        f"; most of it in {' and '.join(chosen)} ({duration(lag)} of {their} "
        f"{duration(whole)} per request"
    )
    if lag >= MOSTLY_LAG * whole:
        text += ": mostly this program's stall, not the network"
    return text + ")"


def _held_back(what: str, attempts: Sequence[Attempt], delays: Sequence[float]) -> Evidence | None:
    """The evidence that a late event loop held ``attempts`` back by ``delays`` (s each), or
    None below the bounds the loop's rules share."""
    # Only delays of LAG_MIN or more count: a busy machine deschedules the whole process for a
    # few ms now and then, which is no stall of the program's own.
    if sum(1 for delay in delays if delay >= LAG_MIN) < MIN_REQUESTS:
        return None
    share = sum(delays) / _total(attempts)
    # Both: a stall holds most requests back, and for a share of their time; a loaded
    # machine's scattered descheduling rarely does both.
    if percentile(delays, 50) < LAG_MIN or share < LAG_MIN_SHARE:
        return None
    return _evidence(what, delays, share, len(attempts))


def event_loop_lag(calls: Sequence[Call]) -> Finding | None:
    """The program's event loop was too busy to run the requests' steps on time."""
    attempts = [a for a in _attempts(calls) if a.event_loop_lag is not None]
    lags = [a.event_loop_lag or 0.0 for a in attempts]
    evidence = _held_back("event loop lag", attempts, lags)
    if evidence is None:
        return None
    servers = [a.server_processing for a in attempts if a.server_processing is not None]
    if servers:
        provider = f"the provider answered in {duration(percentile(servers, 50))} at p50"
    else:
        waits = [a.net("wait") or 0.0 for a in attempts]
        provider = (
            f"the rest of the wait, {duration(percentile(waits, 50))} at p50, was the provider's"
        )
    return Finding(
        rule="event-loop-lag",
        cause=f"the event loop was blocked for {duration(evidence.p50)} at p50 while requests "
        f"were under way: {provider}; the rest is this program{_lag_by_phase(attempts)}",
        evidence=evidence,
        fix="move CPU-bound work off the event loop (asyncio.to_thread, a process pool), and "
        "keep each step between two awaits short",
        saving=Saving(evidence.p50, evidence.p95, len(attempts)),
        claims=claims.per_attempt(claims.STALL, zip(attempts, lags, strict=True)),
    )


def short_of_cpu(calls: Sequence[Call]) -> Finding | None:
    """The machine had no CPU for the program's event loop while requests were under way:
    the loop's thread waited on the kernel's run queue (``llm_latency.event_loop.descheduled``),
    which is neither the program's code nor the provider's. The same bounds as
    :func:`event_loop_lag`."""
    attempts = [a for a in _attempts(calls) if a.event_loop_lag is not None]
    waits = [claims.cpu_wait(a) for a in attempts]
    evidence = _held_back("waiting for a CPU", attempts, waits)
    if evidence is None:
        return None
    return Finding(
        rule="short-of-cpu",
        cause=f"the machine had no CPU for this program's event loop for {duration(evidence.p50)} "
        "at p50 while requests were under way (other processes or a CPU limit took it): the "
        "answers waited to be read; neither the program's code nor the provider",
        evidence=evidence,
        fix="give the process more CPU: a higher CPU request and limit (Kubernetes), fewer "
        "processes per core, or a less busy machine",
        saving=Saving(evidence.p50, evidence.p95, len(attempts)),
        claims=claims.per_attempt(claims.CPU, zip(attempts, waits, strict=True)),
    )


#: Every rule, failures first, in the order findings of equal rank are listed.
RULES: Final[tuple[Rule, ...]] = (
    failures.dns_failure,
    failures.connect_failure,
    failures.tls_failure,
    failures.timeouts,
    failures.connection_reset,
    failures.server_errors,
    failures.failed_requests,
    rate_limits,
    pool_queue,
    http2_stream_limit,
    new_connections,
    slow_dns,
    slow_connect,
    event_loop_lag,
    short_of_cpu,
    network_overhead,
    tokens.provider_queue,
    tokens.slow_generation,
    tokens.long_prompt,
    tokens.long_answer,
    one_by_one.small_prompts_one_by_one,
    not_streamed,
    stream_stall,
    server_time,
)
