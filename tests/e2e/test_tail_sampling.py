"""The Helm tiers in the real Collector: the agent (deploy/helm/otel-collector-agent.values.yaml)
routes each trace by its id to the gateway (otel-collector-gateway.values.yaml), whose
tail_sampling keeps errors, slow traces and a sample of the rest, and sends them to Jaeger.

The gateway decides 180 s after a trace's first span (its values explain why); the test runs it
with ``--set processors::tail_sampling::decision_wait=10s``, the Collector's own override, so
that the policies run as written without a three-minute wait.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.command_line import run_cli_process
from tests.e2e.bundle import ADDRESSES, HELM, get_json, wait_for
from tests.e2e.conftest import Run, Workload, report, start_workload

GATEWAY = HELM / "otel-collector-gateway.values.yaml"
AGENT = HELM / "otel-collector-agent.values.yaml"
HEALTHY = 400


def baseline_share() -> float:
    policies = yaml.safe_load(GATEWAY.read_text())["config"]["processors"]["tail_sampling"]
    (baseline,) = [p for p in policies["policies"] if p["type"] == "probabilistic"]
    return float(baseline["probabilistic"]["sampling_percentage"]) / 100


@pytest.fixture(scope="module")
def sampled(run: Run) -> Iterator[tuple[Workload, dict[str, list[dict[str, Any]]]]]:
    gateway = run.bundle.helm_collector(
        "gateway", GATEWAY, ["processors::tail_sampling::decision_wait=10s"]
    )
    agent = run.bundle.helm_collector("agent", AGENT)
    gateway.start()
    agent.start()
    try:
        workload = start_workload(
            run.directory,
            "sampling",
            "e2e-sampling",
            "--protocol",
            "grpc",
            "--healthy",
            str(HEALTHY),
            endpoint=f"{ADDRESSES['agent']}:4317",
        )
        workload.wait(timeout=120)
        recorded: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for span in workload.spans():
            recorded[span["trace_id"]].append(span)
        yield workload, recorded
    finally:
        agent.stop()
        gateway.stop()


def kept_traces(run: Run) -> dict[str, list[dict[str, Any]]]:
    answer = get_json(
        run.bundle.url("jaeger", 16686, "/api/traces"),
        {"service": "e2e-sampling", "limit": 5000, "lookback": "1h"},
    )
    return {trace["traceID"]: trace["spans"] for trace in answer["data"]}


def _is_error(spans: list[dict[str, Any]]) -> bool:
    return any(span["status"] == "ERROR" for span in spans)


def _is_slow(spans: list[dict[str, Any]]) -> bool:
    return any(span["end"] - span["start"] > 30e9 for span in spans)


@pytest.fixture(scope="module")
def decided(
    run: Run, sampled: tuple[Workload, dict[str, list[dict[str, Any]]]]
) -> dict[str, list[dict[str, Any]]]:
    _, recorded = sampled
    wanted = {trace for trace, spans in recorded.items() if _is_error(spans) or _is_slow(spans)}
    # the kept traces arrive once decided (10 s after their first span) and exported
    decisions: dict[str, list[dict[str, Any]]] = wait_for(
        lambda: (kept := kept_traces(run)) and wanted <= set(kept) and kept,
        timeout=90,
        interval=3,
        what="the gateway's decisions",
    )
    return decisions


def test_error_and_slow_traces_are_kept_whole(
    sampled: tuple[Workload, dict[str, list[dict[str, Any]]]],
    decided: dict[str, list[dict[str, Any]]],
) -> None:
    _, recorded = sampled
    errors = [trace for trace, spans in recorded.items() if _is_error(spans)]
    slow = [trace for trace, spans in recorded.items() if _is_slow(spans)]
    assert len(errors) == 3 and len(slow) == 1  # a 500, a 429, the failed call of several
    for trace in errors + slow:
        assert len(decided[trace]) == len(recorded[trace])


def test_a_trace_of_several_calls_is_decided_whole(
    sampled: tuple[Workload, dict[str, list[dict[str, Any]]]],
    decided: dict[str, list[dict[str, Any]]],
) -> None:
    _, recorded = sampled
    for name in ("several calls, one failed", "several calls, all healthy"):
        (trace,) = [t for t, spans in recorded.items() if any(s["name"] == name for s in spans)]
        calls = [span for span in recorded[trace] if span["kind"] == "CLIENT"]
        assert len(calls) == 3
        assert len(decided.get(trace, [])) in (0, len(recorded[trace])), name
    (failed,) = [
        t
        for t, spans in recorded.items()
        if any(s["name"] == "several calls, one failed" for s in spans)
    ]
    assert len(decided[failed]) == len(recorded[failed])


def test_healthy_fast_traces_are_sampled_at_the_configured_rate(
    sampled: tuple[Workload, dict[str, list[dict[str, Any]]]],
    decided: dict[str, list[dict[str, Any]]],
) -> None:
    _, recorded = sampled
    healthy = [
        trace
        for trace, spans in recorded.items()
        if not _is_error(spans)
        and not _is_slow(spans)
        and not any(span["name"].startswith("several calls") for span in spans)
    ]
    assert len(healthy) == HEALTHY
    kept = sum(trace in decided for trace in healthy)
    share = baseline_share()
    mean = share * len(healthy)
    deviation = math.sqrt(len(healthy) * share * (1 - share))
    # four standard deviations either side: about one run in 16,000 outside by chance
    assert mean - 4 * deviation <= kept <= mean + 4 * deviation, (kept, mean)
    report(
        f"tail sampling: kept {kept} of {len(healthy)} healthy traces (expected {mean:.0f}),"
        " every error and slow trace whole"
    )


def test_explain_jaeger_warns_that_the_traces_were_tail_sampled(
    run: Run, decided: dict[str, list[dict[str, Any]]]
) -> None:
    """The gateway's kept traces read back with ``explain --jaeger --tail-sampled``: the output
    says first that they are a biased sample, and calls each share of time the kept traces',
    never the service's. (The gateway records the policy that kept a trace only on its spans'
    scope, under a feature gate, and Jaeger does not store scope attributes: the spans in
    Jaeger cannot say so themselves.)"""
    result = run_cli_process(
        "explain", "--jaeger", run.bundle.url("jaeger", 16686), "--service", "e2e-sampling",
        "--since", "1h", "--tail-sampled", timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith("warning: these traces were tail-sampled (--tail-sampled)"), first
    assert "% of the time" not in result.stdout
    assert "of the kept traces' time" in result.stdout
    report(f"explain --jaeger on tail-sampled traces: {first[:120]}")
