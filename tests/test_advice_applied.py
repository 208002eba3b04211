"""Advice that pays when it is applied (tests/scenarios/applied.py): each program with a known
cause is run against real peers on loopback and diagnosed, its top finding's fix applied by
code that reads only the finding's ``Fix``, the program run again, and what the user then sees
(the batch's wall time, or each call's p50, as the finding says) is within [0.5, 2] of what the
finding predicted. The table of docs/diagnosis.md: ``python bench/advice_applied.py``."""

from __future__ import annotations

import os

import pytest

from llm_latency.diagnosis import Call, Fix, diagnose
from llm_latency.diagnosis.findings import CONFIGURE, DECORATE, REUSE
from tests.cpu_waits import Collected, Waited, collector_pauses, machine_waits
from tests.scenarios.applied import SCENARIOS, Applied, Outcome, applied
from tests.scenarios.applied_programs import Program, run
from tests.scenarios.client_programs import Config

#: Runs of a scenario at most, when the machine took the CPU from the program's loop.
TRIES = 3
#: The machine took the CPU when it held an attempt's loop for this share of the predicted
#: saving: the realized one is then the machine's as much as the fix's.
DISTURBED = 0.1


def _pays(outcome: Outcome) -> bool:
    return outcome.ratio is not None and 0.5 <= outcome.ratio <= 2.0


def _held(calls: list[Call], collected: Collected, waited: Waited) -> float:
    """How long the machine held one run (s): the longest an attempt's loop waited for a CPU
    (llm_latency.event_loop.descheduled, asyncio clients), this process's threads' run-queue
    waits (the sync program's, the mock servers', those alive at the run's end), or the test
    process's garbage collector (the worker's heap, not the program's)."""
    attempts = [a for call in calls for a in call.attempts]
    descheduled = max((a.descheduled or 0.0 for a in attempts), default=0.0)
    return max(descheduled, collected.seconds, waited.peers)


def _measured(program: Program, config: Config) -> tuple[list[Call], float]:
    """One run of ``program`` and how long the machine held it."""
    with machine_waits(os.getpid()) as waited, collector_pauses() as collected:
        calls = run(program, config)
    return calls, _held(calls, collected, waited)


def _pair(scenario: Applied) -> tuple[Outcome, float, float]:
    """``tests.scenarios.applied.try_advice``, each run measured: the outcome, and how long the machine held the
    run before the fix and the run after it."""
    before, held_before = _measured(scenario.program, scenario.config)
    findings = diagnose(before)
    top = findings[0] if findings else None
    if top is None or top.change is None or top.saving is None:
        return Outcome(scenario, top, before, []), held_before, 0.0
    after, held_after = _measured(scenario.program, applied(top.change, scenario.config))
    return Outcome(scenario, top, before, after), held_before, held_after


@pytest.mark.parametrize("scenario", [pytest.param(s, id=s.name) for s in SCENARIOS])
def test_the_advice_pays_when_applied(scenario: Applied) -> None:
    """On a loaded machine, a run that the machine held (kept the program's loop or this
    process's threads from a CPU, or the test process's garbage collector ran: in the mock
    server's thread as often as the program's, and the program's loop then waits for the GIL,
    which is no CPU wait) for a tenth of the predicted saving or more says nothing of the fix:
    held before the fix, it makes a fix that does nothing look like a saving; held after it, a
    fix that works look like none. A pair that pays counts when the run before the fix was not
    held; one that misses, when neither was. Else the scenario runs again, up to TRIES times,
    and the last pair is judged."""
    for _ in range(TRIES):
        outcome, before, after = _pair(scenario)
        bound = DISTURBED * (outcome.predicted or 0.0)
        if not bound or (before < bound and (_pays(outcome) or after < bound)):
            break
    finding = outcome.finding
    assert finding is not None and finding.rule == scenario.first, finding
    if scenario.api is None:  # nothing a program can apply by rote, and no saving claimed
        assert finding.change is None and finding.saving is None, finding
        return
    assert finding.change is not None and finding.change.api == scenario.api, finding.change
    assert finding.change.call() in finding.fix  # the text says what the Fix is
    assert outcome.kind == "wall", finding.saving  # batches: their wall time is what is seen
    assert _pays(outcome), (
        f"predicted {outcome.predicted}, realized {outcome.realized}, the machine held the "
        f"run before the fix {before:.3f} s and the one after it {after:.3f} s: "
        f"{finding.lines()}"
    )


def test_a_fix_is_applied_from_the_fix_alone() -> None:
    """The mapping reads the fix: how it is applied, its API and its settings, each setting a
    field of the program's configuration named after the API's parameter."""
    start = Config(reuse=False, limit=8, limit_per_host=3)
    assert applied(Fix("requests", "requests.Session", REUSE), start).reuse
    pool = Fix(
        "aiohttp", "aiohttp.TCPConnector", CONFIGURE, (("limit", 12), ("limit_per_host", 12))
    )
    assert (applied(pool, start).limit, applied(pool, start).limit_per_host) == (12, 12)
    retry = applied(Fix("llm_latency", "llm_latency.retry", DECORATE, (("attempts", 2),)), start)
    assert (retry.retry, retry.attempts) == ("llm_latency.retry", 2)
    with pytest.raises(AssertionError, match="no setting for"):
        applied(Fix("httpx", "httpx.Limits", CONFIGURE, (("http2", True),)), start)
