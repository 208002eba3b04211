"""Endpoints compared: ranked by the latency of the requests that succeeded, each with its
failure rate beside it, and the phase that accounts for most of the gap between them.

The gap is read from per-request means, which add up (a phase that happened on two requests of
six counts for a third of its time); the ranking uses the p50 of the total, as the tables do.
``probe URL1 URL2`` (text and HTML) and the scenario scores read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from llm_latency.diagnosis.findings import duration, percent, percentile
from llm_latency.diagnosis.records import Attempt
from llm_latency.timeline import PHASE_NAMES


@dataclass(frozen=True)
class Sample:
    """One request as a comparison reads it: did it succeed, how it ended (the status code,
    or the error), its total and its phases (s)."""

    succeeded: bool
    outcome: str
    total: float
    phases: Mapping[str, float]


def sample_of(attempt: Attempt) -> Sample:
    """The comparison's view of an attempt."""
    outcome = attempt.error or (str(attempt.status) if attempt.status is not None else "failed")
    phases: dict[str, float] = {}
    for phase in attempt.phases:
        phases[phase.name] = phases.get(phase.name, 0.0) + phase.duration
    return Sample(attempt.succeeded, outcome, attempt.duration, phases)


@dataclass(frozen=True)
class Endpoint:
    """One endpoint's side of the comparison."""

    name: str
    requests: int
    failed: int
    #: How the requests ended, most frequent first: ``{"200": 4, "429": 2}``.
    outcomes: dict[str, int]
    #: p50 of the total of the requests that succeeded; None when none did.
    p50: float | None
    #: Mean seconds per successful request of each phase measured (0 where it did not happen).
    phase_means: dict[str, float]

    @property
    def failure_rate(self) -> float:
        """The share of the requests that did not succeed."""
        return self.failed / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class Comparison:
    """The endpoints, fastest first (those with no success last), and the gap's main phase."""

    endpoints: list[Endpoint]
    #: The phase that accounts for most of the gap between the fastest and the slowest.
    gap_phase: str | None
    #: Seconds per request of that phase's difference, and of the whole (mean totals).
    gap_phase_seconds: float
    gap_seconds: float

    def ranking(self) -> str:
        """``Fastest answers (p50 of the successful requests): E2 (302 ms, no failure); E1 1.9 times
        slower (603 ms), 33% failed``."""
        ranked = [e for e in self.endpoints if e.p50 is not None]
        if not ranked:
            return "No endpoint answered successfully."
        best = ranked[0]
        assert best.p50 is not None
        parts = [f"{best.name} ({duration(best.p50)}, {_failures(best)})"]
        for other in ranked[1:]:
            assert other.p50 is not None
            ratio = other.p50 / best.p50 if best.p50 > 0 else float("inf")
            parts.append(
                f"{other.name} {ratio:.1f} times slower ({duration(other.p50)}, {_failures(other)})"
            )
        lead = "Fastest answers" if not best.failed else "Fastest successful answers"
        text = f"{lead} (p50 of the successful requests): " + "; ".join(parts)
        never = [e.name for e in self.endpoints if e.p50 is None]
        if never:
            text += f"; no successful answer from {', '.join(never)}"
        if best.failed:
            text += f". {best.name} is fastest only when it answers: {_failures(best)}"
        return text + "."

    def main_finding(self) -> str | None:
        """``wait accounts for most of the 310 ms gap per request between E2 and E1: 301 ms
        more on E1``."""
        ranked = [e for e in self.endpoints if e.p50 is not None]
        if self.gap_phase is None or len(ranked) < 2:
            return None
        fast, slow = ranked[0], ranked[-1]
        return (
            f"{self.gap_phase} accounts for most of the {duration(self.gap_seconds)} gap per "
            f"request between {fast.name} and {slow.name}: {duration(self.gap_phase_seconds)} "
            f"more on {slow.name}"
        )


def _failures(endpoint: Endpoint) -> str:
    if not endpoint.failed:
        return "no failure"
    return f"{percent(endpoint.failure_rate)} failed, {endpoint.failed} of {endpoint.requests}"


def _endpoint(name: str, samples: Sequence[Sample]) -> Endpoint:
    good = [s for s in samples if s.succeeded]
    outcomes: dict[str, int] = {}
    for sample in samples:
        outcomes[sample.outcome] = outcomes.get(sample.outcome, 0) + 1
    ordered = dict(sorted(outcomes.items(), key=lambda kv: (-kv[1], kv[0])))
    means = {
        phase: sum(s.phases.get(phase, 0.0) for s in good) / len(good)
        for phase in PHASE_NAMES
        if any(phase in s.phases for s in good)
    }
    if good:
        means["total"] = sum(s.total for s in good) / len(good)
    p50 = percentile([s.total for s in good], 50) if good else None
    return Endpoint(name, len(samples), len(samples) - len(good), ordered, p50, means)


def compare(endpoints: Mapping[str, Iterable[Sample]]) -> Comparison:
    """Compare the endpoints (by name, each with its requests' samples)."""
    sides = [_endpoint(name, list(samples)) for name, samples in endpoints.items()]
    sides.sort(key=lambda e: (e.p50 is None, e.p50 or 0.0))
    ranked = [e for e in sides if e.p50 is not None]
    if len(ranked) < 2:
        return Comparison(sides, None, 0.0, 0.0)
    fast, slow = ranked[0], ranked[-1]
    gap = slow.phase_means.get("total", 0.0) - fast.phase_means.get("total", 0.0)
    differences = {
        phase: slow.phase_means.get(phase, 0.0) - fast.phase_means.get(phase, 0.0)
        for phase in PHASE_NAMES
        if phase in slow.phase_means or phase in fast.phase_means
    }
    phase = max(differences, key=lambda p: differences[p], default=None)
    if phase is None or differences[phase] <= 0:
        return Comparison(sides, None, 0.0, gap)
    return Comparison(sides, phase, differences[phase], gap)
