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
from llm_latency.diagnosis import failures, tokens
from llm_latency.diagnosis.advice import pool_knob
from llm_latency.diagnosis.findings import Evidence, Finding, Saving, duration, percentile
from llm_latency.diagnosis.measured import (
    MIN_REQUESTS,
    answered,
    by_host,
    interval,
    sustained_peak,
)
from llm_latency.diagnosis.measured import total as _total
from llm_latency.diagnosis.records import SETUP_PHASES, Attempt, Call
from llm_latency.diagnosis.stream_limit import http2_stream_limit
from llm_latency.timeline import DNS, QUEUE, WAIT

#: new-connections: a connection set-up (DNS + TCP + TLS) that costs at least this (s) at p50...
NEW_CONNECTION_MIN_SETUP: Final = 0.005
#: ... paid again on at least this share of the requests that could have been pooled.
NEW_CONNECTION_MIN_SHARE: Final = 0.5
#: pool-queue: at least this share of the time waiting in ``http.queue``...
QUEUE_MIN_SHARE: Final = 0.05
#: ... by at least two requests that each waited at least this (s).
QUEUE_MIN_WAIT: Final = 0.005
#: slow-dns: name resolution p50 at least this (s).
SLOW_DNS: Final = 0.05
#: slow-connect: TCP + TLS p50 at least this (s).
SLOW_CONNECT: Final = 0.1
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
#: stream-stall: a pause between two chunks of at least this (s)...
STALL_MIN_GAP: Final = 1.0
#: ... and at least this many times the stream's mean gap.
STALL_MIN_RATIO: Final = 5.0
#: event-loop-lag: the program's loop held at least two requests back at least this (s), and
#: this at p50...
LAG_MIN: Final = 0.05
#: ... and for at least this share of the attempts' time.
LAG_MIN_SHARE: Final = 0.1
#: A phase whose time was at least this share the program's own stall is "mostly lag".
MOSTLY_LAG: Final = 0.5

Rule = Callable[[Sequence[Call]], "Finding | None"]


def _attempts(calls: Sequence[Call]) -> list[Attempt]:
    return answered(calls)


def _evidence(phase: str, values: Sequence[float], share: float, requests: int) -> Evidence:
    return Evidence.of(phase, values, share, requests, needed=MIN_REQUESTS)


def new_connections(calls: Sequence[Call]) -> Finding | None:
    """DNS, TCP and TLS paid again on most requests: the client is not reused."""
    attempts = _attempts(calls)
    excess: list[Attempt] = []
    poolable = 0
    for same_host in by_host(attempts).values():
        # The connections the concurrency requires:
        needed = sustained_peak([interval(a) for a in same_host])
        fresh = sorted((a for a in same_host if a.opened_connection), key=lambda a: a.start_ns)
        excess += fresh[needed:]
        poolable += max(len(same_host) - needed, 0)
    setups = [a.connection_setup for a in excess]
    if (
        len(excess) < 2
        or len(excess) < NEW_CONNECTION_MIN_SHARE * poolable
        or percentile(setups, 50) < NEW_CONNECTION_MIN_SETUP
    ):
        return None
    evidence = _evidence("dns+connect+tls", setups, sum(setups) / _total(attempts), len(attempts))
    return Finding(
        rule="new-connections",
        cause=f"{len(excess)} of {poolable} requests that could have used a pooled connection "
        "opened a new one, paying DNS, TCP and TLS again",
        evidence=evidence,
        fix="reuse one client for all requests (one aiohttp.ClientSession, httpx.Client, "
        "requests.Session or SDK client, created once) so connections are kept alive",
        saving=Saving(evidence.p50, evidence.p95, len(excess)),
    )


def pool_queue(calls: Sequence[Call]) -> Finding | None:
    """Requests waited for a free connection in the client's pool."""
    attempts = _attempts(calls)
    pooled = [a for a in attempts if a.protocol != "2"]  # HTTP/2 queues: http2_stream_limit
    waits = [q for a in pooled if (q := a.net("queue") or 0.0) >= QUEUE_MIN_WAIT]
    share = sum(waits) / _total(attempts)
    if len(waits) < MIN_REQUESTS or share < QUEUE_MIN_SHARE:
        return None
    hosts = by_host(attempts).values()
    # Levels of concurrency that lasted: a connection handed from one request to the next
    # overlaps the two for an instant, which is no larger pool.
    wanted = max(sustained_peak([interval(a) for a in same_host]) for same_host in hosts)
    in_use = max(sustained_peak([interval(a, True) for a in same_host]) for same_host in hosts)
    evidence = _evidence(semconv.PHASE_SPAN_NAMES[QUEUE], waits, share, len(attempts))
    return Finding(
        rule="pool-queue",
        cause=f"{len(waits)} requests waited for a free connection: {wanted} were in flight at "
        f"once on a pool that served {in_use} at a time",
        evidence=evidence,
        fix=f"raise the pool's limit ({pool_knob(attempts)}) from {in_use} to {wanted}, the "
        f"concurrency seen, or send at most {in_use} at once",
        saving=Saving(evidence.p50, evidence.p95, len(waits)),
    )


def slow_dns(calls: Sequence[Call]) -> Finding | None:
    """Name resolution is slow."""
    attempts = _attempts(calls)
    lookups = [d for a in attempts if (d := a.net("dns")) is not None]
    if not lookups or percentile(lookups, 50) < SLOW_DNS:
        return None
    evidence = _evidence(
        semconv.PHASE_SPAN_NAMES[DNS], lookups, sum(lookups) / _total(attempts), len(attempts)
    )
    return Finding(
        rule="slow-dns",
        cause=f"resolving the host's name took {duration(evidence.p50)} at p50",
        evidence=evidence,
        fix="cache DNS answers: keep the client's DNS cache on (aiohttp's ttl_dns_cache), run "
        "a local caching resolver (systemd-resolved, dnsmasq, nscd), and reuse connections "
        "so names are resolved less often",
        saving=Saving(evidence.p50, evidence.p95, len(lookups)),
    )


def slow_connect(calls: Sequence[Call]) -> Finding | None:
    """TCP and TLS handshakes are slow: the server is far, or its edge is busy."""
    attempts = _attempts(calls)
    handshakes = [
        sum(a.net(name) or 0.0 for name in SETUP_PHASES if name != "dns")
        for a in attempts
        if a.phase("connect") is not None or a.phase("tls") is not None
    ]
    if not handshakes or percentile(handshakes, 50) < SLOW_CONNECT:
        return None
    evidence = _evidence(
        "http.connect+tls", handshakes, sum(handshakes) / _total(attempts), len(attempts)
    )
    return Finding(
        rule="slow-connect",
        cause=f"the TCP and TLS handshakes took {duration(evidence.p50)} at p50: the server is "
        "far away or its edge is slow",
        evidence=evidence,
        fix="keep connections alive and reuse them so the handshake is paid once per "
        "connection, and use a region or endpoint nearer this program",
        saving=Saving(evidence.p50, evidence.p95, len(handshakes)),
    )


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
    streams = [
        a.time_to_first_chunk
        for a in _attempts(calls)
        if a.time_to_first_chunk is not None and a.succeeded
    ]
    saving = None
    how = "measure the first chunk with `llm-latency probe --stream`"
    if streams:
        first = percentile(streams, 50)
        totals = [a.duration for a in attempts]
        ahead = [max(total - first, 0.0) for total in totals]
        saving = Saving(percentile(ahead, 50), percentile(ahead, 95), len(attempts))
        how = f"streamed requests here had their first chunk after {duration(first)} at p50"
    return Finding(
        rule="not-streamed",
        cause=f"{len(attempts)} answers were not streamed: nothing arrived for "
        f"{duration(evidence.p50)} at p50, until the whole answer was ready",
        evidence=evidence,
        fix=f"stream the response (stream=True) to show the first tokens early; {how}",
        saving=saving,
    )


def stream_stall(calls: Sequence[Call]) -> Finding | None:
    """A stream that stopped for a long time between two chunks."""
    attempts = _attempts(calls)
    stalls: list[float] = []
    usual: list[float] = []
    for attempt in attempts:
        gap, events = attempt.stream_max_gap, attempt.stream_events
        receive = attempt.phase("receive")
        if gap is None or not events or receive is None or gap < STALL_MIN_GAP:
            continue
        mean = receive / max(events, 1)
        if gap >= STALL_MIN_RATIO * mean:
            stalls.append(gap)
            usual.append(mean)
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


def event_loop_lag(calls: Sequence[Call]) -> Finding | None:
    """The program's event loop was too busy to run the requests' steps on time."""
    attempts = [a for a in _attempts(calls) if a.event_loop_lag is not None]
    lags = [a.event_loop_lag or 0.0 for a in attempts]
    # Only lags of LAG_MIN or more count: a busy machine deschedules the whole process for a
    # few ms now and then, which is no stall of the program's own.
    if sum(1 for lag in lags if lag >= LAG_MIN) < MIN_REQUESTS:
        return None
    share = sum(lags) / _total(attempts)
    # Both: a stall of the program's own holds most requests back, and for a share of their
    # time; a loaded machine's scattered descheduling rarely does both.
    if percentile(lags, 50) < LAG_MIN or share < LAG_MIN_SHARE:
        return None
    evidence = _evidence("event loop lag", lags, share, len(attempts))
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
    failures.rate_limits,
    pool_queue,
    http2_stream_limit,
    new_connections,
    slow_dns,
    slow_connect,
    event_loop_lag,
    network_overhead,
    tokens.provider_queue,
    tokens.slow_generation,
    tokens.long_prompt,
    tokens.long_answer,
    tokens.small_prompts_one_by_one,
    not_streamed,
    stream_stall,
    server_time,
)
