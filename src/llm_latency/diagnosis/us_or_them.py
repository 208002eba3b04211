"""Us or them: the program's calls to a host beside the probe's at the same time.

When ``llm-latency watch`` probes the host a program calls, the probe's attempts (marked by
``llm_latency.probe.endpoint``) are a control: they use no pool of the program's, no loop of
its, no retries. At the same time as the program's calls:

- the probe is slow too (its time to first byte above :data:`PROBE_SLOWER` times its own
  baseline, the probe's median outside that time): the provider or the path is slow;
- only the program is slow (its time to first byte, less the server's own time where the
  provider sends it, above :data:`PROGRAM_SLOWER` times the probe's): the cause is the program,
  its pool, its loop or its retries, whose measured shares the finding gives.

The probe's attempts are set apart from the program's: the other rules never see them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from llm_latency.diagnosis import claims
from llm_latency.diagnosis.claims import Claim
from llm_latency.diagnosis.findings import Evidence, Finding, Saving, duration, percentile
from llm_latency.diagnosis.records import Attempt, Call

#: The probe's attempts within this many seconds of the program's calls are "at the same time".
SAME_TIME: Final = 120.0
#: The probe is slow when its time to first byte is this many times its baseline...
PROBE_SLOWER: Final = 2.0
#: ... the program when its own is this many times the probe's...
PROGRAM_SLOWER: Final = 2.0
#: ... and, either way, at least this much slower (s): noise on fast calls is no finding.
MIN_DIFFERENCE: Final = 0.05
#: The program's own shares (pool, loop) are named from this p50 (s) on.
_SHOWN: Final = 0.001
#: The probe kind compared first: it asks for a completion, as the program does.
_KINDS: Final = ("inference", "edge")


def is_probe(call: Call) -> bool:
    """True for a call made by ``llm-latency watch``."""
    return any(attempt.probe is not None for attempt in call.attempts)


def program_calls(calls: Sequence[Call]) -> list[Call]:
    """The calls that are not the probe's: what the other rules diagnose."""
    return [call for call in calls if not is_probe(call)]


def _end_ns(attempt: Attempt) -> int:
    return attempt.start_ns + int(attempt.duration * 1e9)


def _own_path(attempt: Attempt) -> float | None:
    """Time to first byte less the server's own time where the provider sends it: what the
    path and the client added, comparable between a one-token probe and a long prompt."""
    first_byte = attempt.first_byte
    if first_byte is None:
        return None
    return max(first_byte - (attempt.server_processing or 0.0), 0.0)


def _program_share(calls: Sequence[Call]) -> str:
    """What the program's own side took, at p50: pool, loop, retries (only those measured)."""
    attempts = [a for call in calls for a in call.attempts]
    parts = []
    queue = percentile([a.phase("queue") or 0.0 for a in attempts], 50)
    if queue >= _SHOWN:
        parts.append(f"waiting for a pooled connection {duration(queue)}")
    lags = [a.event_loop_lag for a in attempts if a.event_loop_lag is not None]
    if lags and (lag := percentile(lags, 50)) >= _SHOWN:
        parts.append(f"event-loop lag {duration(lag)}")
    backoffs = [call.backoff_time for call in calls]
    retried = sum(1 for call in calls if len(call.attempts) > 1)
    if retried:
        parts.append(
            f"{retried} calls retried, backing off {duration(percentile(backoffs, 50))} at p50"
        )
    return "; ".join(parts) if parts else "none of pool, loop or retries was measured as slow"


#: The parts of an attempt's path to its first byte that the program's side can shorten.
_PROGRAM_PARTS: Final = (claims.QUEUE, claims.SETUP, claims.STALL, claims.CPU, claims.OVERHEAD)


def _unclaimed(
    attempts: Sequence[Attempt], beyond: float, taken: Mapping[tuple[int, str], float]
) -> tuple[list[float], tuple[Claim, ...]]:
    """Per attempt, its own path beyond ``beyond`` (the probe's, s) that no other finding
    claims (``taken``: seconds per attempt id and part), and the claims of it: the
    program's parts of the path (its queue, set-up, loop hold, the network's overhead), each
    up to what the other findings left of it."""
    kept: list[float] = []
    found: list[Claim] = []
    for attempt in attempts:
        want = max((_own_path(attempt) or 0.0) - beyond, 0.0)
        sizes = claims.layout(attempt)
        got = 0.0
        for part in _PROGRAM_PARTS:
            free = max(sizes.get(part, 0.0) - taken.get((id(attempt), part), 0.0), 0.0)
            seconds = min(free, want - got)
            if seconds > 0:
                found.append(Claim(attempt, part, seconds))
                got += seconds
        kept.append(got)
    return kept, tuple(found)


def _compare(
    host: str,
    program: Sequence[Call],
    probes: Sequence[Attempt],
    taken: Mapping[tuple[int, str], float],
) -> Finding | None:
    attempts = [a for call in program for a in call.attempts if a.first_byte is not None]
    if not attempts:
        return None
    begin = min(a.start_ns for a in attempts) - int(SAME_TIME * 1e9)
    end = max(_end_ns(a) for a in attempts) + int(SAME_TIME * 1e9)
    for kind in _KINDS:
        own_kind = [p for p in probes if p.probe_kind == kind and p.first_byte is not None]
        now = [p for p in own_kind if begin <= p.start_ns <= end]
        if not now:
            continue
        before = [p.first_byte or 0.0 for p in own_kind if not begin <= p.start_ns <= end]
        probe_now = percentile([p.first_byte or 0.0 for p in now], 50)
        baseline = percentile(before, 50) if before else None
        mine = percentile([a.first_byte or 0.0 for a in attempts], 50)
        mine_path = percentile([_own_path(a) or 0.0 for a in attempts], 50)
        probe_path = percentile([_own_path(p) or 0.0 for p in now], 50)
        evidence = Evidence.of(
            "time to first byte", [a.first_byte or 0.0 for a in attempts], 1.0, len(attempts)
        )
        probe_text = (
            f"the {kind} probe of {host} took {duration(probe_now)} at p50 at the same time "
            f"({len(now)} probes)"
        )
        if mine_path > PROGRAM_SLOWER * probe_path and mine_path - probe_path >= MIN_DIFFERENCE:
            kept, taking = _unclaimed(attempts, probe_path, taken)
            fix = (
                "look at the program: its connection pool (size, reuse), its event loop "
                "(blocking work between awaits) and its retries; the provider was answering"
            )
            saving = None
            if percentile(kept, 50) >= MIN_DIFFERENCE:
                saving = Saving(percentile(kept, 50), percentile(kept, 95), len(attempts))
            else:
                taking = ()
            if any((id(a), part) in taken for a in attempts for part in _PROGRAM_PARTS):
                fix += (
                    "; the findings on its pool, connections and loop count the seconds they "
                    "name, and their fixes save them"
                    + ("" if saving is not None else ": no more is left to save here")
                )
            return Finding(
                rule="us-or-them",
                cause=f"the program is slow, not {host}: its calls took {duration(mine)} to the "
                f"first byte at p50, while {probe_text}; the program's own share: "
                f"{_program_share(program)}",
                evidence=evidence,
                fix=fix,
                saving=saving,
                claims=taking,
            )
        if (
            baseline is not None
            and probe_now > PROBE_SLOWER * baseline
            and probe_now - baseline >= MIN_DIFFERENCE
        ):
            return Finding(
                rule="us-or-them",
                cause=f"the provider or the path is slow, not the program: {probe_text}, "
                f"against {duration(baseline)} before; the program's calls took "
                f"{duration(mine)} to the first byte at p50",
                evidence=evidence,
                fix=f"nothing to change in the program: check {host}'s status page and the "
                "network path from here (the probe's phases show which: dns, connect, tls or "
                "the wait); another region or provider, or a smaller model, avoids it",
                saving=None,
            )
        return None
    return None


def us_or_them(calls: Sequence[Call], others: Sequence[Finding] = ()) -> list[Finding]:
    """One finding per host that both the program and a probe called, when one side is slow;
    ``others``: the findings on the program's calls, whose claimed seconds "the program is
    slow" leaves to them."""
    taken = claims.claimed(others)
    probes: dict[str, list[Attempt]] = {}
    program: dict[str, list[Call]] = {}
    for call in calls:
        if is_probe(call):
            for attempt in call.attempts:
                probes.setdefault(attempt.host, []).append(attempt)
        elif call.attempts:
            program.setdefault(call.attempts[0].host, []).append(call)
    findings = []
    for host, own in program.items():
        if host in probes and (found := _compare(host, own, probes[host], taken)) is not None:
            findings.append(found)
    return findings
