"""The Helm tiers in the real Collector: the agent (deploy/helm/otel-collector-agent.values.yaml)
routes each trace by its id to one of two gateway pods (otel-collector-gateway.values.yaml),
whose tail_sampling keeps errors, slow traces and a sample of the rest, and sends them to Jaeger.

Each gateway sends to a Jaeger of its own (the second one's hosts file points the Jaeger
Service's name elsewhere), so that where a trace was decided can be read back: a trace kept whole
in one Jaeger was decided whole on one gateway. The agent finds the gateways twice over:

- ``static``: the load_balancing exporter's static resolver, both gateways listed;
- ``dns``: the values' own DNS resolver, the headless Service's name with both gateways'
  addresses in the agent's hosts file; mid-run the second gateway leaves the Service (its
  address goes from the hosts file, as a terminating pod's from the Service's endpoints) and
  stops after the values' preStop wait, scaled to the test's decision_wait: it decides and
  exports what it holds before it exits, and the agent sends it nothing more.

The gateway decides 180 s after a trace's first span (its values explain why); the test runs it
with ``--set processors::tail_sampling::decision_wait=10s``, the Collector's own override, so
that the policies run as written without a three-minute wait.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.command_line import run_cli_process
from tests.e2e.bundle import ADDRESSES, GATEWAY_SERVICE, HELM, Service, get_json
from tests.e2e.conftest import AgentPod, Run, Workload, report, start_workload

GATEWAY = HELM / "otel-collector-gateway.values.yaml"
AGENT = HELM / "otel-collector-agent.values.yaml"
HEALTHY = 400
DECISION_WAIT_S = 10
#: The healthy traces come over this many seconds, beside the slow call's 31 s.
SPREAD_S = 24.0
#: When the second gateway leaves the Service, after the workload starts (dns run).
LEAVES_AFTER_S = 8.0
#: Each gateway pod and the Jaeger it sends to.
JAEGERS = {"gateway": "jaeger", "gateway-2": "jaeger-2"}
JAEGER_SERVICE = "jaeger.observability.svc.cluster.local"


def gateway_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(GATEWAY.read_text())
    return values


def baseline_share() -> float:
    policies = gateway_values()["config"]["processors"]["tail_sampling"]
    (baseline,) = [p for p in policies["policies"] if p["type"] == "probabilistic"]
    return float(baseline["probabilistic"]["sampling_percentage"]) / 100


def _duration_s(text: str) -> float:
    assert text.endswith("s"), text
    return float(text.removesuffix("s"))


def pre_stop_s(decision_wait_s: float) -> float:
    """How long a leaving gateway keeps running, as the values' preStop sleep does: its
    decision_wait, then the agents' DNS interval and the batch timeout, once more each, and what
    is left of the values' margin."""
    values = gateway_values()
    agent = yaml.safe_load(AGENT.read_text())
    sleep = float(values["lifecycleHooks"]["preStop"]["sleep"]["seconds"])
    wait = _duration_s(values["config"]["processors"]["tail_sampling"]["decision_wait"])
    interval = _duration_s(
        agent["config"]["exporters"]["load_balancing"]["resolver"]["dns"]["interval"]
    )
    batch = _duration_s(values["config"]["processors"]["batch"]["timeout"])
    margin = sleep - (wait + interval + batch)
    assert margin >= 0, "the preStop sleep ends before the gateway decides what it holds"
    assert values["terminationGracePeriodSeconds"] > sleep + 20  # the exporter's drain after it
    return decision_wait_s + interval + batch + margin


@dataclass
class Sampled:
    """One run of the sampling workload through the agent and the two gateways."""

    resolver: str
    service: str
    #: the gateways' baseline policy kept every trace
    keeps_all: bool
    workload: Workload
    recorded: dict[str, list[dict[str, Any]]]
    #: dns: when the second gateway left the Service (epoch seconds)
    left_at: float | None
    agent: Service
    #: where this run's part of the agent's log starts
    log_from: int

    def agent_log(self) -> str:
        with self.agent.log.open("rb") as log:
            log.seek(self.log_from)
            return log.read().decode(errors="replace")


@pytest.fixture(scope="module")
def second_jaeger(run: Run) -> Iterator[Service]:
    jaeger = run.bundle.compose_service("jaeger-2", like="jaeger")
    try:
        jaeger.start()
        yield jaeger
    finally:
        jaeger.stop()


def _agent_values(run: Run, resolver: str) -> Path:
    if resolver == "dns":
        return AGENT
    values = yaml.safe_load(AGENT.read_text())
    values["config"]["exporters"]["load_balancing"]["resolver"] = {
        "static": {"hostnames": [f"{ADDRESSES[pod]}:4317" for pod in JAEGERS]}
    }
    path = run.directory / "agent-static.values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def _gateway_values(run: Run, keep_all: bool) -> Path:
    """The gateway's values; with ``keep_all``, its baseline policy keeps every trace, so that
    a trace lost on the way shows as missing."""
    if not keep_all:
        return GATEWAY
    values = gateway_values()
    for policy in values["config"]["processors"]["tail_sampling"]["policies"]:
        if policy["type"] == "probabilistic":
            policy["probabilistic"]["sampling_percentage"] = 100
    path = run.directory / "gateway-keep-all.values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.fixture(scope="module", params=["static", "dns"])
def sampled(
    request: pytest.FixtureRequest, run: Run, second_jaeger: Service, agent_pod: AgentPod
) -> Iterator[Sampled]:
    resolver: str = request.param
    # dns: every trace is kept, and the second gateway leaves mid-run
    keep_all = resolver == "dns"
    decision = [f"processors::tail_sampling::decision_wait={DECISION_WAIT_S}s"]
    values = _gateway_values(run, keep_all)
    gateways = [
        run.bundle.helm_collector("gateway", values, decision),
        run.bundle.helm_collector(
            "gateway-2", values, decision, names={JAEGER_SERVICE: [ADDRESSES["jaeger-2"]]}
        ),
    ]
    agent = run.bundle.helm_collector(
        "agent", _agent_values(run, resolver), binds=agent_pod.binds, env=agent_pod.env
    )
    log_from = agent.log.stat().st_size if agent.log.exists() else 0
    service = f"e2e-sampling-{resolver}"
    left_at = None
    try:
        for collector in [*gateways, agent]:
            collector.start()
        workload = start_workload(
            run.directory,
            "sampling",
            service,
            "--protocol",
            "grpc",
            "--healthy",
            str(HEALTHY),
            "--spread",
            str(SPREAD_S),
            endpoint=f"{ADDRESSES['agent']}:4317",
        )
        if resolver == "dns":
            time.sleep(LEAVES_AFTER_S)
            run.bundle.resolve("agent", {GATEWAY_SERVICE: [ADDRESSES["gateway"]]})
            left_at = time.time()
            time.sleep(pre_stop_s(DECISION_WAIT_S))
            gateways[1].stop()
        workload.wait(timeout=120)
        recorded: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for span in workload.spans():
            recorded[span["trace_id"]].append(span)
        yield Sampled(resolver, service, keep_all, workload, recorded, left_at, agent, log_from)
    finally:
        agent.stop()
        for gateway in gateways:
            gateway.stop()


def kept_traces(run: Run, jaeger: str, service: str) -> dict[str, list[dict[str, Any]]]:
    answer = get_json(
        run.bundle.url(jaeger, 16686, "/api/traces"),
        {"service": service, "limit": 5000, "lookback": "1h"},
    )
    return {trace["traceID"]: trace["spans"] for trace in answer["data"]}


def _is_error(spans: list[dict[str, Any]]) -> bool:
    return any(span["status"] == "ERROR" for span in spans)


def _is_slow(spans: list[dict[str, Any]]) -> bool:
    return any(span["end"] - span["start"] > 30e9 for span in spans)


@pytest.fixture(scope="module")
def decided(run: Run, sampled: Sampled) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The kept traces, by the gateway that kept them."""
    recorded = sampled.recorded
    wanted = {trace for trace, spans in recorded.items() if _is_error(spans) or _is_slow(spans)}
    if sampled.keeps_all:
        wanted = set(recorded)

    def kept() -> dict[str, dict[str, list[dict[str, Any]]]]:
        return {pod: kept_traces(run, jaeger, sampled.service) for pod, jaeger in JAEGERS.items()}

    # the kept traces arrive once decided (10 s after their first span) and exported; where
    # every trace is kept, the test that they all came says which did not
    deadline = time.monotonic() + (60 if sampled.keeps_all else 90)
    while not wanted <= set().union(*(decisions := kept()).values()):
        if time.monotonic() > deadline:
            if sampled.keeps_all:
                return decisions
            pytest.fail(f"the gateways' decisions: {len(wanted)} traces wanted, not all kept")
        time.sleep(3)
    time.sleep(5)  # the last batches of healthy traces, decided with the others
    return kept()


def _in_flight_at(sampled: Sampled, spans: list[dict[str, Any]]) -> bool:
    """Whether a trace's spans were on their way (the SDK's 5 s batch, the agent's 2 s) when
    the second gateway left the ring: such a trace may be split, as deploy/README.md says."""
    if sampled.left_at is None:
        return False
    ends = [span["end"] / 1e9 for span in spans]
    return bool(min(ends) - 10 <= sampled.left_at <= max(ends) + 10)


def test_every_kept_trace_is_whole_on_one_gateway(
    sampled: Sampled, decided: dict[str, dict[str, list[dict[str, Any]]]]
) -> None:
    recorded = sampled.recorded
    split = []
    for trace, spans in recorded.items():
        on = {pod: len(kept[trace]) for pod, kept in decided.items() if trace in kept}
        if len(on) > 1 or (on and sum(on.values()) != len(spans)):
            split.append(trace)
    assert all(_in_flight_at(sampled, recorded[trace]) for trace in split), split
    for pod, kept in decided.items():
        assert kept, f"{pod} kept nothing: the agent did not spread the traces"
    report(
        f"tail sampling ({sampled.resolver} resolver): kept "
        + ", ".join(f"{len(kept)} traces on {pod}" for pod, kept in decided.items())
        + f"; {len(split)} split (in flight when a gateway left)"
    )


def test_error_and_slow_traces_are_kept_whole(
    sampled: Sampled, decided: dict[str, dict[str, list[dict[str, Any]]]]
) -> None:
    recorded = sampled.recorded
    errors = [trace for trace, spans in recorded.items() if _is_error(spans)]
    slow = [trace for trace, spans in recorded.items() if _is_slow(spans)]
    assert len(errors) == 3 and len(slow) == 1  # a 500, a 429, the failed call of several
    for trace in errors + slow:
        (where,) = [kept for kept in decided.values() if trace in kept]
        assert len(where[trace]) == len(recorded[trace])


def test_a_trace_of_several_calls_is_decided_whole(
    sampled: Sampled, decided: dict[str, dict[str, list[dict[str, Any]]]]
) -> None:
    recorded = sampled.recorded
    for name in ("several calls, one failed", "several calls, all healthy"):
        (trace,) = [t for t, spans in recorded.items() if any(s["name"] == name for s in spans)]
        calls = [span for span in recorded[trace] if span["kind"] == "CLIENT"]
        assert len(calls) == 3
        where = [kept[trace] for kept in decided.values() if trace in kept]
        assert len(where) <= 1, name
        assert [len(spans) for spans in where] in ([], [len(recorded[trace])]), name
    (failed,) = [
        t
        for t, spans in recorded.items()
        if any(s["name"] == "several calls, one failed" for s in spans)
    ]
    assert any(failed in kept for kept in decided.values())


def test_explain_jaeger_warns_that_the_traces_were_tail_sampled(
    run: Run, sampled: Sampled, decided: dict[str, dict[str, list[dict[str, Any]]]]
) -> None:
    """The gateways' kept traces read back with ``explain --jaeger`` and no flag: the spans say
    they were tail-sampled (the gateway's ``resource/tail-sampled`` marks each one it passes
    on, and Jaeger keeps it among the process's tags), so the output says first that they are a
    biased sample, and calls each share of time the kept traces', never the service's. (The
    compose bundle, which samples nothing, gives no warning: test_explain_jaeger.py.)"""
    result = run_cli_process(
        "explain", "--jaeger", run.bundle.url("jaeger", 16686), "--service", sampled.service,
        "--since", "1h", timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith(
        "warning: these traces were tail-sampled (the spans carry llm_latency.tail_sampled"
    ), first
    assert "% of the time" not in result.stdout
    assert "of the kept traces' time" in result.stdout
    report(f"explain --jaeger on tail-sampled traces: {first[:120]}")


# pytest holds one ``sampled`` run at a time: the two tests that concern one run only come last,
# so that each run (a workload through the agent and both gateways) is set up once.
@pytest.mark.parametrize("sampled", ["static"], indirect=True)  # the dns run keeps all
def test_healthy_fast_traces_are_sampled_at_the_configured_rate(
    sampled: Sampled, decided: dict[str, dict[str, list[dict[str, Any]]]]
) -> None:
    assert not sampled.keeps_all
    recorded = sampled.recorded
    healthy = [
        trace
        for trace, spans in recorded.items()
        if not _is_error(spans)
        and not _is_slow(spans)
        and not any(span["name"].startswith("several calls") for span in spans)
    ]
    assert len(healthy) == HEALTHY
    kept = sum(any(trace in on for on in decided.values()) for trace in healthy)
    share = baseline_share()
    mean = share * len(healthy)
    deviation = math.sqrt(len(healthy) * share * (1 - share))
    # four standard deviations either side: about one run in 16,000 outside by chance
    assert mean - 4 * deviation <= kept <= mean + 4 * deviation, (kept, mean)
    report(
        f"tail sampling ({sampled.resolver} resolver): kept {kept} of {len(healthy)} healthy"
        f" traces (expected {mean:.0f}), every error and slow trace whole"
    )


@pytest.mark.parametrize("sampled", ["dns"], indirect=True)  # the static run's gateways stay
def test_a_gateway_that_leaves_drops_nothing(
    sampled: Sampled, decided: dict[str, dict[str, list[dict[str, Any]]]]
) -> None:
    assert sampled.left_at is not None
    recorded = sampled.recorded
    # every trace kept (the baseline keeps all), every span of it
    spans_kept = {
        trace: sum(len(kept[trace]) for kept in decided.values() if trace in kept)
        for trace in recorded
    }
    lost = {
        trace: (n, len(recorded[trace]))
        for trace, n in spans_kept.items()
        if n != len(recorded[trace])
    }
    assert lost == {}, f"{len(lost)} of {len(recorded)} traces lost or incomplete"
    # nothing sent to the gateway after it left, nothing refused on the way
    log = sampled.agent_log()
    assert "Exporting failed" not in log and "Dropping data" not in log, log[-3000:]
    later = [
        trace
        for trace in decided["gateway-2"]
        if min(span["start"] for span in recorded[trace]) / 1e9 > sampled.left_at + 10
    ]
    assert later == []
    before = len(decided["gateway-2"])
    report(
        f"tail sampling (dns resolver): a gateway left mid-run ({LEAVES_AFTER_S:.0f} s in) and"
        f" stopped after its preStop wait; all {len(recorded)} traces kept whole"
        f" ({before} by the gateway that left)"
    )
