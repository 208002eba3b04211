"""Endpoints compared: ranked by the latency of their successful requests with the failure rate
beside it, the main finding the phase behind most of the gap, and in the text table a row for
the requests, how they ended and every phase measured (receive included)."""

from __future__ import annotations

import re

from llm_latency.diagnosis.compare import Sample, compare
from tests.command_line import mock_server, run_cli


def _requests(n: int, outcome: str, wait: float, tls: float = 0.0, tls_on: int = 0) -> list[Sample]:
    """``n`` requests that ended in ``outcome``; the first ``tls_on`` paid ``tls`` more."""
    ok = outcome == "200"
    samples = []
    for i in range(n):
        phases = {"connect": 0.001, "send": 0.0002, "wait": wait if ok else 0.002,
                  "receive": 0.001}  # fmt: skip
        if i < tls_on:
            phases["tls"] = tls
        samples.append(Sample(ok, outcome, sum(phases.values()), phases))
    return samples


def test_the_issue_s_two_endpoints() -> None:
    """E1: 4 x 200 in about 300 ms and 2 x 429; E2: 6 x 200 in about 600 ms, two of them with
    a 109 ms TLS handshake. E1 is fastest only when it answers; the gap is the wait."""
    compared = compare(
        {
            "E1": _requests(4, "200", 0.302) + _requests(2, "429", 0.0),
            "E2": _requests(6, "200", 0.603, tls=0.109, tls_on=2),
        }
    )
    e1, e2 = compared.endpoints
    assert (e1.name, e1.failed, e1.requests, e1.outcomes) == ("E1", 2, 6, {"200": 4, "429": 2})
    assert (e2.name, e2.failed) == ("E2", 0)
    ranking = compared.ranking()
    assert ranking.startswith("Fastest successful answers")
    assert "E1 (" in ranking and "33% failed, 2 of 6" in ranking
    assert "E1 is fastest only when it answers" in ranking
    assert "E2 2.0 times slower" in ranking and "no failure" in ranking
    assert compared.gap_phase == "wait"
    main = compared.main_finding()
    assert main is not None and main.startswith("wait accounts for most of the")
    assert "between E1 and E2: 301 ms more on E2" in main


def test_a_gap_in_connection_set_up_is_named() -> None:
    compared = compare(
        {
            "E1": _requests(4, "200", 0.3, tls=0.01, tls_on=4),
            "E2": _requests(4, "200", 0.3, tls=0.25, tls_on=4),
        }
    )
    assert compared.gap_phase == "tls"
    assert compared.ranking().startswith("Fastest answers")  # E1 had no failure


def test_an_endpoint_that_never_answered_is_not_ranked() -> None:
    compared = compare({"E1": _requests(3, "failed in tls", 0.0), "E2": _requests(3, "200", 0.2)})
    assert [e.name for e in compared.endpoints] == ["E2", "E1"]
    assert "no successful answer from E1" in compared.ranking()
    assert compared.main_finding() is None


def test_probe_text_comparison() -> None:
    """The text table has the requests, their statuses, the failure rate and every measured
    phase (receive too); under it the ranking and the main finding."""
    with mock_server("--ttfb", "0.05", "--tokens", "1", "--rate-limit-every", "3") as fast, \
            mock_server("--ttfb", "0.35", "--tokens", "1") as slow:  # fmt: skip
        result = run_cli("probe", fast.url, slow.url, "-n", "6", env={"COLUMNS": "120"})
    assert result.returncode == 3, result.stderr  # the 429s
    out = result.stdout
    table = out[out.index("endpoints compared") :]
    assert re.search(r"│ requests\s+│\s+6 │\s+6 │", table)
    assert re.search(r"│ status\s+│\s+200:4 429:2 │\s+200:6 │", table)
    assert re.search(r"│ failed\s+│\s+33% │\s+0% │", table)
    for phase in ("send", "wait", "receive", "total"):
        assert re.search(rf"│ {phase} p50 ", table), phase
    assert "Fastest successful answers (p50 of the successful requests): #1" in out
    assert "#1 is fastest only when it answers: 33% failed, 2 of 6" in out.replace("\n  ", " ")
    assert re.search(r"main finding: wait accounts for most of the \d+ ms gap", out)
