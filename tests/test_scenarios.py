"""The labelled set: in every scenario the injected cause is ranked first, and no forbidden
finding appears (the score table of docs/diagnosis.md, printed by bench/diagnosis_score.py)."""

from __future__ import annotations

import os

import pytest

from llm_latency.diagnosis.claims import over_claimed
from tests.cpu_waits import collector_pauses, machine_waits
from tests.scenarios.catalog import Outcome, Scenario, judge, play, verdict, with_lag
from tests.scenarios.labelled import SCENARIOS

#: Runs of a scenario at most, when what the machine took covers its forbidden findings.
TRIES = 3


def _played(scenario: Scenario) -> tuple[Outcome, list[str], float]:
    """One run: its outcome, its forbidden findings, and what the machine measurably took
    meanwhile (s): the run-queue waits of this process's threads (the program's loop, the
    mock server's) and the garbage collector's pauses."""
    with machine_waits(os.getpid()) as waited, collector_pauses() as collected:
        outcome = play(scenario)
    _, wrong, _ = verdict(scenario, outcome.found)
    return outcome, wrong, waited.peers + collected.seconds


@pytest.mark.parametrize("scenario", [pytest.param(s, id=s.name) for s in SCENARIOS])
def test_the_cause_is_ranked_first(scenario: Scenario) -> None:
    """A forbidden finding whose evidence (its p50 per request) is no more than what the
    machine took from the program while it ran (a loop thread kept from a CPU, a server
    thread late, a collection of the worker's heap: time in no phase's lag and in no
    server's own time, which a finding of the network reads as the network's) says nothing
    of the rule: the scenario runs again, up to TRIES times. Any other is wrong at once."""
    for _ in range(TRIES):
        outcome, wrong, took = _played(scenario)
        covered = [
            f for f in outcome.findings if f.rule in wrong and f.evidence.p50 <= took
        ]  # fmt: skip
        if len(covered) < len(wrong) or not wrong:
            break
    assert outcome.records, "the scenario sent nothing"
    ok, wrong, missed = verdict(scenario, outcome.found)
    assert not wrong, (
        f"forbidden findings: {wrong} in {outcome.found}; the machine took {took:.3f} s"
    )
    assert outcome.first == scenario.first, outcome.found
    assert ok and not missed
    assert over_claimed(outcome.findings) == []  # two findings never claim the same seconds
    if scenario.fix_mentions is not None:
        assert scenario.fix_mentions in outcome.findings[0].fix, outcome.findings[0].fix
        assert "aiohttp" not in outcome.findings[0].fix or "aiohttp" in scenario.name
    if scenario.saving is not None:  # computed from the measured rates, near what was injected
        low, high = scenario.saving
        saving = outcome.findings[0].saving
        assert saving is not None and low <= saving.p50 <= high, saving


@pytest.mark.parametrize(
    "scenario", [pytest.param(s, id=s.name) for s in SCENARIOS if s.needs_phase_lag]
)
def test_the_stall_is_taken_off_the_network_phases(scenario: Scenario) -> None:
    """The same runs, their phase spans given the per-phase lag the contract defines (the
    overlap of each phase with the stall the program recorded): the stall is the finding, and
    no network rule fires on it."""
    outcome = play(scenario)
    assert outcome.stalls, "the program did not block its loop"
    records = with_lag(outcome.records, outcome.stalls)
    findings, found = judge(records, outcome.endpoints)
    ok, wrong, _ = verdict(scenario, found)
    assert not wrong, f"forbidden findings: {wrong} in {found}"
    assert found and found[0] == "event-loop-lag", found
    assert "most of it in" in findings[0].cause
    assert "mostly this program's stall, not the network" in findings[0].cause
    assert ok


@pytest.mark.parametrize(
    ("name", "client"),
    [("pool-aiohttp", "aiohttp"), ("pool-httpx", "httpx"), ("pool-requests", "urllib3")],
)
def test_each_attempt_names_its_client(name: str, client: str) -> None:
    """``llm_latency.client`` on every attempt: what lets a fix name the client's setting."""
    (scenario,) = [s for s in SCENARIOS if s.name == name]
    outcome = play(scenario)
    attempts = [r for r in outcome.records if "url.full" in r.attributes]
    assert len(attempts) == 8
    assert {r.attributes.get("llm_latency.client") for r in attempts} == {client}
