"""Advice applied: per program with a known cause (tests/scenarios/applied.py), the top
finding, its fix applied by code that reads only the finding's ``Fix``, and what the fix saved
against what the finding predicted. Prints the Markdown table of docs/diagnosis.md.

    python bench/advice_applied.py            # every scenario once
    python bench/advice_applied.py --runs 3   # each three times: the ratios of every run

The saving is what the finding says the user sees: the batch's wall time (from its first
call's start to its last one's end, as the spans show it) or each call's p50.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llm_latency.diagnosis.findings import duration
from tests.scenarios.applied import SCENARIOS, Outcome, try_advice


def row(outcomes: list[Outcome]) -> str:
    """One scenario's row: its top finding and fix, and each run's prediction and result."""
    first = outcomes[0]
    scenario, finding = first.scenario, first.finding
    rule = finding.rule if finding is not None else "none"
    change = finding.change.call() if finding is not None and finding.change else "-"
    if first.predicted is None:
        return (
            f"| {scenario.name} | {scenario.cause} | {rule} | {change} | no saving claimed "
            "| - | - | - |"
        )
    predicted = ", ".join(duration(o.predicted or 0.0) for o in outcomes)
    realized = ", ".join(duration(o.realized or 0.0) for o in outcomes)
    ratios = ", ".join(f"{o.ratio:.2f}" if o.ratio is not None else "-" for o in outcomes)
    return (
        f"| {scenario.name} | {scenario.cause} | {rule} | `{change}` | {first.kind} "
        f"| {predicted} | {realized} | {ratios} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="runs of each scenario")
    args = parser.parse_args()
    print(
        "| scenario | program | top finding | fix applied | saving of | predicted | realized "
        "| realized/predicted |"
    )
    print("|---|---|---|---|---|---|---|---|")
    within = actionable = 0
    for scenario in SCENARIOS:
        outcomes = [try_advice(scenario) for _ in range(args.runs)]
        print(row(outcomes), flush=True)
        for outcome in outcomes:
            if outcome.ratio is not None:
                actionable += 1
                within += 0.5 <= outcome.ratio <= 2.0
    print(f"\n{within} of {actionable} applied fixes within [0.5, 2] of their prediction")


if __name__ == "__main__":
    main()
