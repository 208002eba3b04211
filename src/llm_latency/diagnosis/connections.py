"""The rules about opening connections: ``new-connections`` (set-ups paid again because the
client is not reused) and ``slow-connect`` (each handshake is slow).

Both see the same handshakes of a program that opens a connection per call. The seconds are
claimed once: ``new-connections`` claims those of the connections one reused client would not
open (its fix removes them), and ``slow-connect`` only those of the connections the concurrency
needs, which only a nearer endpoint shortens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from llm_latency.diagnosis import claims
from llm_latency.diagnosis.advice import (
    closing_setting,
    keep_alive_fix,
    keep_alive_text,
    reuse_fix,
    reuse_text,
)
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
from llm_latency.diagnosis.seen import seen_saving

#: new-connections: a connection set-up (DNS + TCP + TLS) that costs at least this (s) at p50...
NEW_CONNECTION_MIN_SETUP: Final = 0.005
#: ... paid again on at least this share of the requests that could have been pooled.
NEW_CONNECTION_MIN_SHARE: Final = 0.5
#: slow-connect: TCP + TLS p50 at least this (s).
SLOW_CONNECT: Final = 0.1


def excess_connections(attempts: Sequence[Attempt]) -> tuple[list[Attempt], int]:
    """The attempts that opened a connection the concurrency did not need (per host: all but
    as many as were in flight at once, the first ones kept), and how many requests could
    have used a pooled connection."""
    excess: list[Attempt] = []
    poolable = 0
    for same_host in by_host(attempts).values():
        needed = sustained_peak(
            [interval(a) for a in same_host], [interval(a, True) for a in same_host]
        )
        fresh = sorted((a for a in same_host if a.opened_connection), key=lambda a: a.start_ns)
        excess += fresh[needed:]
        poolable += max(len(same_host) - needed, 0)
    return excess, poolable


def claimed_by_reuse(attempts: Sequence[Attempt]) -> list[Attempt]:
    """The attempts whose set-up ``new-connections`` claims (empty when it does not apply)."""
    excess, poolable = excess_connections(attempts)
    setups = [a.connection_setup for a in excess]
    if (
        len(excess) < 2
        or len(excess) < NEW_CONNECTION_MIN_SHARE * poolable
        or percentile(setups, 50) < NEW_CONNECTION_MIN_SETUP
    ):
        return []
    return excess


def removed_per_call(calls: Sequence[Call], gone: dict[int, float]) -> list[float]:
    """Per call, the seconds a fix removes from it: ``gone`` per attempt (by ``id``)."""
    return [sum(gone.get(id(a), 0.0) for a in call.attempts) for call in calls]


def new_connections(calls: Sequence[Call]) -> Finding | None:
    """DNS, TCP and TLS paid again on most requests: the client is not reused."""
    attempts = answered(calls)
    excess = claimed_by_reuse(attempts)
    if not excess:
        return None
    _, poolable = excess_connections(attempts)
    setups = [a.connection_setup for a in excess]
    evidence = Evidence.of(
        "dns+connect+tls",
        setups,
        sum(setups) / _total(attempts),
        len(attempts),
        needed=MIN_REQUESTS,
    )
    gone = {id(a): a.connection_setup for a in excess}
    saving = seen_saving(calls, removed_per_call(calls, gone))
    cause = (
        f"{len(excess)} of {poolable} requests that could have used a pooled connection "
        "opened a new one, paying DNS, TCP and TLS again"
    )
    # A client that is reused but closes its connections: the setting at fault is the fix.
    setting = closing_setting(excess)
    if setting is None:
        change = reuse_fix(calls, excess)
        fix = reuse_text(change)
    else:
        change = keep_alive_fix(excess, setting, len(attempts) - poolable)
        fix = keep_alive_text(setting, change)
        cause += f": the client closed each connection after its request ({setting})"
    return Finding(
        rule="new-connections",
        cause=cause,
        evidence=evidence,
        fix=fix,
        saving=saving or Saving(evidence.p50, evidence.p95, len(excess)),
        change=change,
        claims=claims.per_attempt(claims.SETUP, [(a, a.connection_setup) for a in excess]),
    )


def _handshake(attempt: Attempt) -> float:
    return sum(attempt.net(name) or 0.0 for name in SETUP_PHASES if name != "dns")


def slow_connect(calls: Sequence[Call]) -> Finding | None:
    """TCP and TLS handshakes are slow: the server is far, or its edge is busy."""
    attempts = answered(calls)
    connected = [
        a for a in attempts if a.phase("connect") is not None or a.phase("tls") is not None
    ]
    handshakes = [_handshake(a) for a in connected]
    if not handshakes or percentile(handshakes, 50) < SLOW_CONNECT:
        return None
    evidence = Evidence.of(
        "http.connect+tls",
        handshakes,
        sum(handshakes) / _total(attempts),
        len(attempts),
        needed=MIN_REQUESTS,
    )
    claimed = {id(a) for a in claimed_by_reuse(attempts)}
    own = [(a, _handshake(a)) for a in connected if id(a) not in claimed]
    kept = [seconds for _, seconds in own]
    cause = (
        f"the TCP and TLS handshakes took {duration(evidence.p50)} at p50: the server is far "
        "away or its edge is slow"
    )
    nearer = "a region or endpoint nearer this program shortens each handshake"
    if claimed:
        cause += (
            f"; {len(claimed)} of the {len(handshakes)} were connections one reused client "
            "would not open (new-connections)"
        )
        needs = "the one" if len(kept) == 1 else f"the {len(kept)}"
        fix = (
            f"apply new-connections' fix to remove {len(claimed)} of the handshakes; "
            f"for {needs} the concurrency needs, {nearer}"
        )
    else:
        fix = (
            f"the client kept its connections ({len(handshakes)} handshakes for the requests in "
            f"flight at once): {nearer}"
        )
    saving = Saving(percentile(kept, 50), percentile(kept, 95), len(kept)) if kept else None
    taken = claims.per_attempt(claims.SETUP, own) if saving is not None else ()
    return Finding("slow-connect", cause, evidence, fix, saving, claims=taken)
