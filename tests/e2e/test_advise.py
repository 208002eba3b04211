"""The findings service in the bundle: the seed's pool-limited burst (aiohttp, 30 requests at once
through ``TCPConnector(limit_per_host=5)`` to a slow loopback server, again and again) reaches
``llm-latency advise`` through the real Collector's ``traces/advise`` pipeline; the service
exports the pool finding with its saving, Prometheus scrapes it, the alert fires (the test's
``LLMFixWouldSaveNow``: the bundle's LLMFixWouldSave with ``for: 0s``, conftest.py) and
Alertmanager receives the fix; the same burst through a pool of 30 raises nothing (no finding
with a saving, no alert). Then the fix
is applied to the first program (its pool as the finding says) and the finding clears."""

from __future__ import annotations

import signal
import time
from typing import Any

from tests.e2e.bundle import ADDRESSES, HELM, get_json, wait_for
from tests.e2e.conftest import ADVISE_WINDOW, AgentPod, Run, report, start_workload
from tests.e2e.test_metrics import query
from tests.e2e.test_traces import jaeger_traces

LIMITED, HEALTHY = "e2e-burst", "e2e-burst-pooled"
HELM_SERVICE = "e2e-burst-helm"
OUTAGE_SERVICE = "e2e-advise-outage"
#: How long each program runs its bursts (s): the findings show within a diagnosis or two.
SECONDS = 60


def findings(run: Run, service: str) -> list[dict[str, Any]]:
    url = run.bundle.url("advise", 9466, "/findings.json")
    answer: list[dict[str, Any]] = get_json(url, {"service": service})["findings"]
    return answer


def windows(run: Run) -> list[dict[str, Any]]:
    answer: list[dict[str, Any]] = get_json(run.bundle.url("advise", 9466, "/findings.json"))[
        "windows"
    ]
    return answer


def alerts(run: Run, service: str) -> list[dict[str, Any]]:
    received = get_json(run.bundle.url("alertmanager", 9093, "/api/v2/alerts"))
    return [
        alert
        for alert in received
        if alert["labels"]["alertname"] == "LLMFixWouldSaveNow"
        and alert["labels"].get("service") == service
    ]


def test_pool_burst_alert_with_its_fix_then_the_fix_clears_it(run: Run) -> None:
    limited = start_workload(run.directory, "burst", LIMITED, "--seconds", str(SECONDS))
    healthy = start_workload(
        run.directory, "burst", HEALTHY, "--seconds", str(SECONDS), "--limit-per-host", "30"
    )
    pool = wait_for(
        lambda: [f for f in findings(run, LIMITED) if f["rule"] == "pool-queue"],
        timeout=SECONDS,
        interval=2,
        what="the pool finding on the findings service",
    )[0]
    fix = pool["finding"]["fix"]
    assert "aiohttp.TCPConnector(limit=30, limit_per_host=30)" in fix
    assert pool["host"] == "127.0.0.1" and pool["saving_ratio"] > 0.1
    assert pool["finding"]["saving"]["p50"] > 0
    report(
        f"advise: pool-queue for {LIMITED}, {pool['saving_ratio']:.0%} of the calls' time, "
        f"{pool['saving_seconds_per_minute']:.1f} s per minute; fix: {fix}"
    )

    scraped = wait_for(
        lambda: query(
            run, f'llm_latency_advice_saving_ratio{{service="{LIMITED}",rule="pool-queue"}}'
        ),
        timeout=60,
        interval=3,
        what="Prometheus's scrape of the saving",
    )
    assert scraped[0]["metric"]["job"] == "advise"

    (alert,) = wait_for(
        lambda: alerts(run, LIMITED), timeout=90, interval=3, what="LLMFixWouldSaveNow"
    )
    annotations = alert["annotations"]
    assert alert["labels"]["rule"] == "pool-queue" and alert["labels"]["host"] == "127.0.0.1"
    assert annotations["fix"] == fix
    assert "of the calls' time" in annotations["saving"] and "per minute" in annotations["saving"]
    assert annotations["findings"].endswith(f"/?service={LIMITED}&host=127.0.0.1")
    report(f"Alertmanager received LLMFixWouldSaveNow for {LIMITED}: {annotations['summary']}")

    limited.wait(timeout=SECONDS + 60)
    healthy.wait(timeout=SECONDS + 60)
    time.sleep(10)  # the last bursts' traces settle and are diagnosed
    # The server's own time may be named (server-time), with no client-side fix: nothing to save.
    assert [f["rule"] for f in findings(run, HEALTHY) if f["finding"]["saving"] is not None] == []
    assert all(f["saving_ratio"] == 0 for f in findings(run, HEALTHY))
    assert alerts(run, HEALTHY) == []
    windows = get_json(run.bundle.url("advise", 9466, "/findings.json"))["windows"]
    assert any(w["service"] == HEALTHY and w["calls"] >= 30 for w in windows), windows

    # The fix, applied: the same program, its pool as the finding says, until the calls of
    # the pool-limited run have left the window.
    fixed = start_workload(
        run.directory, "burst", LIMITED, "--seconds", str(ADVISE_WINDOW + 40),
        "--limit-per-host", "30",
    )  # fmt: skip
    wait_for(
        lambda: not any(f["rule"] == "pool-queue" for f in findings(run, LIMITED)),
        timeout=ADVISE_WINDOW + 60,
        interval=3,
        what="the pool finding to clear",
    )
    assert any(w["service"] == LIMITED for w in get_json(
        run.bundle.url("advise", 9466, "/findings.json"))["windows"])  # fmt: skip
    wait_for(
        lambda: (
            not query(
                run, f'llm_latency_advice_saving_ratio{{service="{LIMITED}",rule="pool-queue"}}'
            )
        ),
        timeout=60,
        interval=3,
        what="the saving to leave Prometheus",
    )
    wait_for(
        lambda: (
            not [
                a
                for a in get_json(run.bundle.url("prometheus", 9090, "/api/v1/alerts"))["data"][
                    "alerts"
                ]
                if a["labels"].get("service") == LIMITED
            ]
        ),
        timeout=60,
        interval=3,
        what="the alert to resolve",
    )
    report(f"advise: the pool finding of {LIMITED} cleared once its pool was 30")
    fixed.wait(timeout=ADVISE_WINDOW + 100)


def test_the_helm_agent_sends_its_copy_through_load_balancing(
    run: Run, agent_pod: AgentPod
) -> None:
    """deploy/helm/otel-collector-agent.values.yaml: the agent's load_balancing/advise exporter
    (routing_key: service, the advise Service's name resolved to the service's address) brings
    the burst's spans to the findings service, before any sampling (no gateway runs here: the
    agent's traces to it wait in their own queue, and the advise copy goes on)."""
    agent = run.bundle.helm_collector(
        "agent",
        HELM / "otel-collector-agent.values.yaml",
        binds=agent_pod.binds,  # its k8s_attributes reads the API server (tests/e2e/kube.py)
        env=agent_pod.env,
    )
    agent.start()
    try:
        workload = start_workload(
            run.directory, "burst", HELM_SERVICE, "--seconds", "20", "--protocol", "grpc",
            endpoint=f"{ADDRESSES['agent']}:4317",
        )  # fmt: skip
        pool = wait_for(
            lambda: [f for f in findings(run, HELM_SERVICE) if f["rule"] == "pool-queue"],
            timeout=90,
            interval=2,
            what="the pool finding of the spans sent through the Helm agent",
        )[0]
        workload.wait(timeout=60)
    finally:
        agent.stop()
    assert "aiohttp.TCPConnector(" in pool["finding"]["fix"]
    report(f"advise: pool-queue for {HELM_SERVICE}, through the Helm agent's load_balancing/advise")


def test_advise_killed_and_restarted_loses_nothing_of_the_traces(run: Run) -> None:
    """The findings service holds a side copy: killed (SIGKILL) for 15 s under traffic, every
    span the program exported still reaches Jaeger, and once restarted it refills its window
    from the spans that come next."""
    advise = run.bundle.services["advise"]
    workload = start_workload(
        run.directory, "steady", OUTAGE_SERVICE, "--seconds", "45", "--pause", "0.2"
    )
    try:
        wait_for(
            lambda: any(w["service"] == OUTAGE_SERVICE for w in windows(run)),
            timeout=60,
            what="the steady calls in the findings service's window",
        )
        advise.stop(signal.SIGKILL)
        time.sleep(15)
    finally:
        advise.start()
    workload.wait(timeout=120)
    recorded = {(span["trace_id"], span["span_id"]) for span in workload.spans()}

    def stored() -> set[tuple[str, str]]:
        traces = jaeger_traces(run, OUTAGE_SERVICE)
        return {(trace, span["spanID"]) for trace in traces for span in traces[trace]}

    wait_for(lambda: recorded <= stored(), timeout=60, what="every span in Jaeger")
    refilled = wait_for(
        lambda: [w for w in windows(run) if w["service"] == OUTAGE_SERVICE],
        timeout=60,
        what="the restarted service's window",
    )
    report(
        f"advise killed for 15 s: Jaeger has all {len(recorded)} spans of {OUTAGE_SERVICE}; "
        f"restarted, its window refilled ({refilled[0]['calls']} calls)"
    )
