"""The diagnosis's score on the labelled scenarios (tests/scenarios): per scenario, the finding
ranked first, the wrong findings (forbidden ones that appeared) and the missed one (the
expected finding, absent). Prints the Markdown table of docs/diagnosis.md.

    python bench/diagnosis_score.py              # the engine of this checkout
    python bench/diagnosis_score.py --with-lag   # the loop scenarios' phase spans also given the
                                                 # per-phase lag (the overlap with the stall)

An older engine scores the same scenarios with its source first on the path:
``git archive REV src | tar -x -C /tmp/old && PYTHONPATH=/tmp/old/src python
bench/diagnosis_score.py``. An engine with no endpoint comparison
(``llm_latency.diagnosis.compare``) is scored on the first finding of the slower endpoint, which
is what its conclusion named as that endpoint's main finding. An engine from before the token
rules (``llm_latency.diagnosis.tokens``) misses the six token scenarios (long-answer to
small-prompts-one-by-one): the spans carry the tokens, but nothing reads them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llm_latency.diagnosis import as_calls, diagnose
from tests.scenarios.catalog import Outcome, Scenario, play, verdict, with_lag
from tests.scenarios.labelled import SCENARIOS


def found_of(scenario: Scenario, outcome: Outcome, lag: bool) -> list[str]:
    """What the engine ranks, for ``scenario``'s outcome."""
    records = with_lag(outcome.records, outcome.stalls) if lag else outcome.records
    try:
        from tests.scenarios.catalog import judge

        return judge(records, outcome.endpoints)[1]
    except ImportError:  # no comparison: the slower endpoint's own first finding
        pass
    by_port = {
        port: [r for r in records if f":{port}/" in str(r.attributes.get("url.full", ""))]
        for port in outcome.endpoints.values()
    }
    ports = sorted(outcome.endpoints.values())
    slowest = max(
        ports, key=lambda p: sum(a.duration for c in as_calls(by_port[p]) for a in c.attempts)
    )
    trace_ids = {r.trace_id for r in by_port[slowest]}
    own = [r for r in records if r.trace_id in trace_ids]
    return [f.rule for f in diagnose(own)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--with-lag", action="store_true", help="add the per-phase loop lag")
    args = parser.parse_args()
    print("| scenario | injected cause | expected first | ranked first | wrong | missed |")
    print("|---|---|---|---|---|---|")
    passed = 0
    for scenario in SCENARIOS:
        outcome = play(scenario, judged=False)
        found = found_of(scenario, outcome, args.with_lag and scenario.needs_phase_lag)
        ok, wrong, missed = verdict(scenario, found)
        passed += ok
        first = found[0] if found else "none"
        print(
            f"| {scenario.name} | {scenario.cause} | {scenario.first or 'none'} | "
            f"{first}{'' if ok else ' ✗'} | {', '.join(wrong) or '-'} | "
            f"{', '.join(m for m in missed if m) or '-'} |"
        )
    print(f"\n{passed} of {len(SCENARIOS)} scenarios right")


if __name__ == "__main__":
    main()
