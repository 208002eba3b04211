"""``slow-dns``: name resolution is slow, and what removes it, if anything does.

Each lookup is one of three kinds, per name (``server.address``) in start order: the *first*
of its name; one that began while another lookup of the name was in flight (*shared*: a burst
of connections opening at once, all waiting for one answer, whether the client's DNS cache is
on or off); or one that began after an earlier answer had come (*repeated*: what a DNS cache
would have answered). Only the repeated ones have a client-side fix, and it is not the same
for every client: aiohttp has a DNS cache of its own (``use_dns_cache``, ``ttl_dns_cache``),
httpx and requests leave it to the system's resolver. A repeated lookup on a connection that a
reused client would not have opened is ``new-connections``' (its fix removes it). For first and
shared lookups no setting of the client is the fix, and the finding claims no saving.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from llm_latency import semconv
from llm_latency.diagnosis import claims
from llm_latency.diagnosis.advice import client_of, dns_cache_fix
from llm_latency.diagnosis.connections import claimed_by_reuse, removed_per_call
from llm_latency.diagnosis.findings import Evidence, Finding, duration, percentile
from llm_latency.diagnosis.measured import MIN_REQUESTS, answered
from llm_latency.diagnosis.measured import total as _total
from llm_latency.diagnosis.records import Attempt, Call
from llm_latency.diagnosis.seen import seen_saving
from llm_latency.timeline import DNS

#: slow-dns: name resolution p50 at least this (s).
SLOW_DNS: Final = 0.05

#: The clients with no DNS cache of their own, as a fix names them.
_NAMES: Final = {"httpx": "httpx", "httpx2": "httpx2", "urllib3": "requests (urllib3)"}
#: The kinds of a lookup: the first of its name, one begun while another of the name was in
#: flight, and one that repeated an answer that had come.
FIRST, SHARED, REPEATED = "first", "shared", "repeated"


@dataclass(frozen=True)
class Lookup:
    """One attempt's lookup: its kind (first, shared, repeated), its time less the program's
    own stall (s), and for a repeated one how long after the name's last answer it began."""

    attempt: Attempt
    kind: str
    time: float
    since_answer: float = 0.0


def lookups(attempts: Sequence[Attempt]) -> list[Lookup]:
    """The lookups of ``attempts``, each with its kind, in start order per name."""
    timed = []
    for attempt in attempts:
        for phase in attempt.phases:
            if phase.name == "dns":
                start = attempt.start_ns + int(phase.start * 1e9)
                timed.append((attempt.host, start, start + int(phase.duration * 1e9), attempt))
    timed.sort(key=lambda t: (t[0], t[1]))
    found: list[Lookup] = []
    answered_by: dict[str, int] = {}  # per name, when the latest answer so far came
    for host, start, end, attempt in timed:
        time = attempt.net("dns") or 0.0
        last = answered_by.get(host)
        if last is None:
            found.append(Lookup(attempt, FIRST, time))
        elif start < last:
            found.append(Lookup(attempt, SHARED, time))
        else:
            found.append(Lookup(attempt, REPEATED, time, (start - last) / 1e9))
        answered_by[host] = max(last or end, end)
    return found


def slow_dns(calls: Sequence[Call]) -> Finding | None:
    """Name resolution is slow."""
    attempts = answered(calls)
    every = lookups(attempts)
    times = [each.time for each in every]
    if not times or percentile(times, 50) < SLOW_DNS:
        return None
    evidence = Evidence.of(
        semconv.PHASE_SPAN_NAMES[DNS],
        times,
        sum(times) / _total(attempts),
        len(attempts),
        needed=MIN_REQUESTS,
    )
    claimed = {id(a) for a in claimed_by_reuse(attempts)}
    repeated = [e for e in every if e.kind == REPEATED and id(e.attempt) not in claimed]
    cause = f"resolving the host's name took {duration(evidence.p50)} at p50"
    kinds = _kinds(every, claimed)
    if not repeated:
        return Finding(
            "slow-dns",
            f"{cause}: {kinds}",
            evidence,
            "no setting of the client removes a first lookup: resolve each name once before "
            "the requests start, off their path (at start-up), so that the connections find it "
            "in the client's DNS cache or the resolver's, and use a nearer or local caching "
            "resolver (systemd-resolved, dnsmasq, nscd)",
            None,
        )
    longest = max(e.since_answer for e in repeated)
    change = dns_cache_fix([e.attempt for e in repeated], longest)
    gone = {id(e.attempt): e.time for e in repeated}
    saving = seen_saving(calls, removed_per_call(calls, gone))
    after = (
        f"{len(repeated)} {'lookup' if len(repeated) == 1 else 'lookups'} repeated an answer "
        f"{duration(longest)} old at most"
    )
    if change is not None:
        fix = (
            f"cache the answers in the client: {change.text()} ({after}; aiohttp keeps an "
            "answer ttl_dns_cache s, 10 by default, and none with use_dns_cache=False)"
        )
    else:
        fix = (
            f"run a local caching resolver (systemd-resolved, dnsmasq, nscd): "
            f"{_NAMES.get(client_of(attempts) or '', 'the client')} keeps no DNS cache of its own "
            f"({after})"
        )
    taken = claims.per_attempt(claims.SETUP, [(e.attempt, e.time) for e in repeated])
    taken = taken if saving is not None else ()
    return Finding("slow-dns", f"{cause}: {kinds}", evidence, fix, saving, change, taken)


def _kinds(every: Sequence[Lookup], claimed: set[int]) -> str:
    """``3 were the first of their name, 19 began while the same name's lookup was in flight
    ...``."""
    first = sum(1 for e in every if e.kind == FIRST)
    shared = sum(1 for e in every if e.kind == SHARED)
    repeated = [e for e in every if e.kind == REPEATED]
    one = first == 1
    parts = [
        f"{first} {'was' if one else 'were'} the first lookup of {'its' if one else 'their'} name"
    ]
    if shared:
        parts.append(
            f"{shared} began while a lookup of the same name was in flight and waited for an "
            "answer (a burst of connections: a DNS cache, on or off, does not shorten it)"
        )
    if repeated:
        kept = sum(1 for e in repeated if id(e.attempt) in claimed)
        parts.append(
            f"{len(repeated)} repeated an answer that had come"
            + (f" ({kept} on connections new-connections' fix removes)" if kept else "")
        )
    return ", ".join(parts)
