"""The diagnosis rules: each reads finished calls and returns a finding, or None when it does
not apply. Every threshold is a named constant here and listed in README ("Diagnosis").

Shares are of the attempts' summed duration; percentiles are over the requests a rule concerns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from llm_latency import semconv
from llm_latency.diagnosis.findings import Evidence, Finding, Saving, duration, percentile
from llm_latency.diagnosis.records import Attempt, Call
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
#: rate-limits: at least this share of the attempts answered 429...
RATE_LIMITED_MIN_SHARE: Final = 0.05
#: ... or at least this share of them retries.
RETRIED_MIN_SHARE: Final = 0.1
#: not-streamed: a non-streamed answer whose wait p50 is at least this (s)...
NOT_STREAMED_MIN_WAIT: Final = 1.0
#: ... and at least this share of the attempt.
NOT_STREAMED_MIN_SHARE: Final = 0.6
#: stream-stall: a pause between two chunks of at least this (s)...
STALL_MIN_GAP: Final = 1.0
#: ... and at least this many times the stream's mean gap.
STALL_MIN_RATIO: Final = 5.0
#: event-loop-lag: the program's loop held responses back at least this (s) at p50...
LAG_MIN: Final = 0.02
#: ... or for at least this share of the attempts' time.
LAG_MIN_SHARE: Final = 0.1

Rule = Callable[[Sequence[Call]], "Finding | None"]


def _attempts(calls: Sequence[Call]) -> list[Attempt]:
    return [a for call in calls for a in call.attempts]


def _total(attempts: Sequence[Attempt]) -> float:
    return sum(a.duration for a in attempts) or 1e-9


def _peak(intervals: Sequence[tuple[int, int]]) -> int:
    """The largest number of intervals that overlap at one instant."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    peak = current = 0
    for _, step in edges:  # an end sorts before a start at the same instant (-1 < 1)
        current += step
        peak = max(peak, current)
    return peak


def _by_host(attempts: Sequence[Attempt]) -> dict[str, list[Attempt]]:
    hosts: dict[str, list[Attempt]] = {}
    for attempt in attempts:
        hosts.setdefault(attempt.host, []).append(attempt)
    return hosts


def _span(attempt: Attempt, skip_queue: bool = False) -> tuple[int, int]:
    start = attempt.start_ns
    if skip_queue:
        start += int((attempt.phase("queue") or 0.0) * 1e9)
    return start, attempt.start_ns + int(attempt.duration * 1e9)


def new_connections(calls: Sequence[Call]) -> Finding | None:
    """DNS, TCP and TLS paid again on most requests: the client is not reused."""
    attempts = _attempts(calls)
    excess: list[Attempt] = []
    poolable = 0
    for same_host in _by_host(attempts).values():
        needed = _peak([_span(a) for a in same_host])  # connections the concurrency requires
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
    evidence = Evidence.of("dns+connect+tls", setups, sum(setups) / _total(attempts), len(attempts))
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
    waits = [q for a in pooled if (q := a.phase("queue") or 0.0) >= QUEUE_MIN_WAIT]
    share = sum(waits) / _total(attempts)
    if len(waits) < 2 or share < QUEUE_MIN_SHARE:
        return None
    hosts = _by_host(attempts).values()
    wanted = max(_peak([_span(a) for a in same_host]) for same_host in hosts)
    in_use = max(_peak([_span(a, skip_queue=True) for a in same_host]) for same_host in hosts)
    evidence = Evidence.of(semconv.PHASE_SPAN_NAMES[QUEUE], waits, share, len(attempts))
    return Finding(
        rule="pool-queue",
        cause=f"{len(waits)} requests waited for a free connection: {wanted} were in flight at "
        f"once on a pool that served {in_use} at a time",
        evidence=evidence,
        fix=f"raise the pool's limit (aiohttp limit / limit_per_host, httpx max_connections) "
        f"from {in_use} to {wanted}, the concurrency seen, or send at most {in_use} at once",
        saving=Saving(evidence.p50, evidence.p95, len(waits)),
    )


def slow_dns(calls: Sequence[Call]) -> Finding | None:
    """Name resolution is slow."""
    attempts = _attempts(calls)
    lookups = [d for a in attempts if (d := a.phase("dns")) is not None]
    if not lookups or percentile(lookups, 50) < SLOW_DNS:
        return None
    evidence = Evidence.of(
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
        (a.phase("connect") or 0.0) + (a.phase("tls") or 0.0)
        for a in attempts
        if a.phase("connect") is not None or a.phase("tls") is not None
    ]
    if not handshakes or percentile(handshakes, 50) < SLOW_CONNECT:
        return None
    evidence = Evidence.of(
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
    waits = [a.phase("wait") or 0.0 for a in attempts]
    if percentile(server, 50) < SERVER_MIN_TIME:
        return None
    if sum(server) < SERVER_MIN_SHARE_OF_WAIT * sum(waits):
        return None
    if sum(waits) < WAIT_MIN_SHARE * _total(attempts):
        return None
    evidence = Evidence.of(
        "server processing", server, sum(server) / _total(attempts), len(attempts)
    )
    streamed = all(a.streamed for a in attempts)
    fix = "a faster model, a shorter prompt or a lower max_tokens shorten it"
    if not streamed:
        fix += "; streaming brings the first token sooner"
    return Finding(
        rule="server-time",
        cause=f"the provider spent {duration(evidence.p50)} at p50 processing each request: "
        f"{sum(server) / sum(waits) * 100:.0f}% of the wait for the first byte",
        evidence=evidence,
        fix=fix,
        saving=None,
    )


def network_overhead(calls: Sequence[Call]) -> Finding | None:
    """Time to the first byte that the server's own time does not explain."""
    attempts = [a for a in _attempts(calls) if a.network_overhead is not None]
    overheads = [a.network_overhead or 0.0 for a in attempts]
    waits = [a.phase("wait") or 0.0 for a in attempts]
    if not attempts or percentile(overheads, 50) < OVERHEAD_MIN:
        return None
    if percentile(overheads, 50) < OVERHEAD_MIN_SHARE_OF_WAIT * percentile(waits, 50):
        return None
    evidence = Evidence.of(
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


def rate_limits(calls: Sequence[Call]) -> Finding | None:
    """Many 429s or retries: time lost to failed attempts and backoffs."""
    attempts = _attempts(calls)
    if not attempts:
        return None
    limited = sum(1 for a in attempts if a.status == 429)
    retried = sum(1 for a in attempts if a.resend_count > 0)
    if limited < RATE_LIMITED_MIN_SHARE * len(attempts) and retried < RETRIED_MIN_SHARE * len(
        attempts
    ):
        return None
    # Per call that retried or was refused: its failed attempts' time and its backoffs.
    affected = [
        call
        for call in calls
        if len(call.attempts) > 1 or any(a.status == 429 for a in call.attempts)
    ]
    lost = [
        sum(a.duration for a in call.attempts if not a.succeeded) + call.backoff_time
        for call in affected
    ]
    if not lost:
        return None
    backoff = sum(call.backoff_time for call in calls)
    whole = sum(call.duration for call in calls) or 1e-9  # backoffs included
    evidence = Evidence.of(
        "failed attempts + retry.backoff", lost, sum(lost) / whole, len(calls), unit="calls"
    )
    fix = (
        "limit the request rate on the client side (a token bucket under the provider's "
        "x-ratelimit-limit-requests) and honour retry-after (the SDKs do; a loop of one's own "
        "can use llm_latency.retry)"
    )
    if not retried:
        # Refused and not retried: those calls failed. What a limit saves is the failure
        # itself, not the few ms a 429 takes.
        return Finding(
            rule="rate-limits",
            cause=f"{limited} of {len(attempts)} attempts were rate limited (429) and none was "
            "retried: those calls failed",
            evidence=evidence,
            fix=fix,
            saving=None,
        )
    return Finding(
        rule="rate-limits",
        cause=f"{limited} of {len(attempts)} attempts were rate limited (429) and {retried} "
        f"{'was a retry' if retried == 1 else 'were retries'}; {duration(backoff)} went to "
        "retry.backoff",
        evidence=evidence,
        fix=fix,
        saving=Saving(evidence.p50, evidence.p95, len(lost)),
    )


def not_streamed(calls: Sequence[Call]) -> Finding | None:
    """A long answer read in one piece: streaming would show its first token much sooner."""
    attempts = [a for a in _attempts(calls) if a.succeeded and not a.streamed]
    waits = [a.phase("wait") or 0.0 for a in attempts]
    if not attempts or percentile(waits, 50) < NOT_STREAMED_MIN_WAIT:
        return None
    if sum(waits) < NOT_STREAMED_MIN_SHARE * _total(attempts):
        return None
    evidence = Evidence.of(
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


def event_loop_lag(calls: Sequence[Call]) -> Finding | None:
    """The program's event loop was too busy to read responses that had arrived."""
    attempts = [a for a in _attempts(calls) if a.event_loop_lag is not None]
    lags = [a.event_loop_lag or 0.0 for a in attempts]
    if not attempts or max(lags) < LAG_MIN:
        return None
    share = sum(lags) / _total(attempts)
    if percentile(lags, 50) < LAG_MIN and share < LAG_MIN_SHARE:
        return None
    evidence = Evidence.of("event loop lag", lags, share, len(attempts))
    servers = [a.server_processing for a in attempts if a.server_processing is not None]
    if servers:
        provider = f"the provider answered in {duration(percentile(servers, 50))} at p50"
    else:
        waits = [max((a.phase("wait") or 0.0) - (a.event_loop_lag or 0.0), 0.0) for a in attempts]
        provider = (
            f"the rest of the wait, {duration(percentile(waits, 50))} at p50, was the provider's"
        )
    return Finding(
        rule="event-loop-lag",
        cause=f"the event loop was blocked for {duration(evidence.p50)} at p50 while responses "
        f"waited to be read: {provider}; the rest is this program",
        evidence=evidence,
        fix="move CPU-bound work off the event loop (asyncio.to_thread, a process pool), and "
        "keep each step between two awaits short",
        saving=Saving(evidence.p50, evidence.p95, len(attempts)),
    )


#: Every rule, in the order findings of equal saving are listed.
RULES: Final[tuple[Rule, ...]] = (
    pool_queue,
    http2_stream_limit,
    new_connections,
    slow_dns,
    slow_connect,
    event_loop_lag,
    network_overhead,
    rate_limits,
    not_streamed,
    stream_stall,
    server_time,
)
