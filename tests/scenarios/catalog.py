"""The labelled scenarios: each injects one known cause against real peers on loopback, and
says which finding must come first and which must not appear at all.

:func:`play` runs one (instrumented, spans kept in memory) and diagnoses it, as ``probe`` and
``explain`` do; comparisons of two endpoints are scored by the phase named as the main part of
the gap (``gap: wait``). ``tests/test_scenarios.py`` runs them all; ``bench/diagnosis_score.py``
prints the score table of docs/diagnosis.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import llm_latency
from llm_latency import semconv
from llm_latency.diagnosis import SpanRecord, as_calls, diagnose, from_readable_spans
from llm_latency.diagnosis.findings import Finding
from tests.scenarios.programs import Stalls

#: Every finding the engine can give, and the name a comparison's main phase is scored by.
RULE_IDS = frozenset(
    {
        "dns-failure", "connect-failure", "tls-failure", "timeouts", "connection-reset",
        "server-errors", "failed-requests", "rate-limits", "pool-queue", "new-connections",
        "slow-dns", "slow-connect", "event-loop-lag", "network-overhead", "not-streamed",
        "stream-stall", "server-time", "provider-queue", "slow-generation", "long-prompt",
        "long-answer", "small-prompts-one-by-one",
    }
)  # fmt: skip
GAPS = frozenset(f"gap: {p}" for p in ("dns", "connect", "tls", "send", "wait", "receive"))


@dataclass
class Run:
    """What a scenario's program has at hand: the stalls it records, and its endpoints (for a
    comparison: name -> port)."""

    stalls: Stalls = field(default_factory=Stalls)
    endpoints: dict[str, int] = field(default_factory=dict)


Program = Callable[[Run], Coroutine[None, None, None]]


@dataclass(frozen=True)
class Scenario:
    """One labelled cause: ``first`` must be ranked first (None: no finding at all), no finding
    of ``forbidden`` may appear; ``fix_mentions``: words the first finding's fix must hold;
    ``needs_phase_lag``: the cause is the loop's stall in a connection phase, which the
    diagnosis tells by the per-phase lag of the phase spans; ``saving``: the bounds (s) of the
    first finding's saving per request at p50, from what the scenario injects."""

    name: str
    cause: str
    first: str | None
    forbidden: frozenset[str]
    program: Program
    fix_mentions: str | None = None
    needs_phase_lag: bool = False
    saving: tuple[float, float] | None = None


def but(*allowed: str) -> frozenset[str]:
    """Every finding except ``allowed``."""
    return (RULE_IDS | GAPS) - set(allowed)


@dataclass
class Outcome:
    """A scenario's run: the spans (as records), the stalls, the findings and the ranking."""

    records: list[SpanRecord]
    stalls: list[tuple[int, int]]
    endpoints: dict[str, int]
    findings: list[Finding]
    found: list[str]

    @property
    def first(self) -> str | None:
        """What was ranked first (None: nothing was found)."""
        return self.found[0] if self.found else None


def judge(
    records: Sequence[SpanRecord], endpoints: dict[str, int]
) -> tuple[list[Finding], list[str]]:
    """The findings, and what is scored: the rule ids, or for a comparison the gap's phase."""
    if not endpoints:
        findings = diagnose(list(records))
        return findings, [f.rule for f in findings]
    # Imported here: bench/diagnosis_score.py scores engines from before the comparison too.
    from llm_latency.diagnosis.compare import compare, sample_of

    attempts = [a for call in as_calls(list(records)) for a in call.attempts]
    by_port = {
        name: [sample_of(a) for a in attempts if f":{port}/" in a.url]
        for name, port in endpoints.items()
    }
    comparison = compare(by_port)
    return [], [f"gap: {comparison.gap_phase}"] if comparison.gap_phase else []


def play(scenario: Scenario, judged: bool = True) -> Outcome:
    """Run ``scenario`` instrumented, on a loop of its own, and judge its spans (unless not
    ``judged``: the caller judges)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    llm_latency.instrument(tracer_provider=provider, configure=False)
    run = Run()
    try:
        asyncio.run(scenario.program(run))
    finally:
        llm_latency.uninstrument()
    records = from_readable_spans(exporter.get_finished_spans())
    findings, found = judge(records, run.endpoints) if judged else ([], [])
    return Outcome(records, run.stalls.windows, run.endpoints, findings, found)


def verdict(scenario: Scenario, found: Sequence[str]) -> tuple[bool, list[str], list[str]]:
    """Whether the scenario passes, its wrong findings (forbidden ones that appeared) and its
    missed one (the expected finding, when it did not appear at all)."""
    first = found[0] if found else None
    wrong = [f for f in found if f in scenario.forbidden]
    missed = [scenario.first] if scenario.first is not None and scenario.first not in found else []
    return first == scenario.first and not wrong, wrong, missed


def with_lag(records: Sequence[SpanRecord], stalls: Sequence[tuple[int, int]]) -> list[SpanRecord]:
    """``records`` with the per-phase loop lag an asyncio attempt's phase spans carry (helper
    ``loop``'s measurement, the contract of ``llm_latency.event_loop.lag``): how much of each
    phase overlapped the program's stalls, and on the request span the sum over its phases."""

    def overlap(start: int, end: int) -> float:
        return sum(max(min(end, b) - max(start, a), 0) for a, b in stalls) / 1e9

    lag_by_parent: dict[str, float] = {}
    out: list[SpanRecord] = []
    for record in records:
        if semconv.PHASE in record.attributes and record.parent_id is not None:
            lag = overlap(record.start_ns, record.end_ns)
            lag_by_parent[record.parent_id] = lag_by_parent.get(record.parent_id, 0.0) + lag
            if lag > 0:
                record = replace(
                    record, attributes={**record.attributes, semconv.EVENT_LOOP_LAG: lag}
                )
        out.append(record)
    return [
        replace(r, attributes={**r.attributes, semconv.EVENT_LOOP_LAG: lag_by_parent[r.span_id]})
        if r.span_id in lag_by_parent and semconv.EVENT_LOOP_LAG in r.attributes
        else r
        for r in out
    ]
