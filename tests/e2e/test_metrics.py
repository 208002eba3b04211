"""Prometheus, scraping the real Collector: the dashboard's queries, the alert rules on live
series, and an alert that reaches Alertmanager."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.deploy_workload import (
    GRAFANA_VARIABLES,
    Query,
    alert_rules,
    dashboard_queries,
    datasource_queries,
    substitute,
)
from tests.e2e.bundle import get_json, wait_for
from tests.e2e.conftest import ALERT_SECONDS, Run

#: The scenario (host name) of tests/e2e/workload.py's ``alerts`` mode that makes each rule's
#: expression true. LLMNoRequests is about a job, not a host: see its own test.
FIRES_ON = {
    "LLMWaitP95High": "slow-wait.test",
    "LLMTimeToFirstChunkP95High": "slow-stream.test",
    "LLMRateLimited": "rate-limited.test",
    "LLMRetryRateHigh": "retried.test",
    "LLMNewConnectionShareHigh": "fresh.test",
    "LLMDNSOrTLSSlow": "slow-dns.test",
    "LLMRateLimitNearZero": "nearly-out.test",
    "LLMConnectionPoolSaturated": "pool.test",
}


def query(run: Run, promql: str, at: float | None = None) -> list[dict[str, Any]]:
    answer = get_json(
        run.bundle.url("prometheus", 9090, "/api/v1/query"),
        {"query": promql, "time": at if at is not None else time.time()},
    )
    assert answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def hosts(result: list[dict[str, Any]], job: str = "e2e-alerts") -> set[str]:
    return {
        series["metric"].get("server_address", "")
        for series in result
        if series["metric"].get("job") == job
    }


def test_every_alert_is_checked_here() -> None:
    assert {rule["alert"] for rule in alert_rules()} == {*FIRES_ON, "LLMNoRequests"}


@pytest.mark.parametrize("alert", sorted(FIRES_ON))
def test_the_scenario_of_each_alert_makes_its_expression_true(run: Run, alert: str) -> None:
    (rule,) = [rule for rule in alert_rules() if rule["alert"] == alert]
    scenario = FIRES_ON[alert]
    found = wait_for(
        lambda: scenario in (seen := hosts(query(run, rule["expr"]))) and seen,
        timeout=ALERT_SECONDS + 60,
        interval=3,
        what=f"{alert} on {scenario}",
    )
    assert "healthy.test" not in found


def test_no_requests_fires_when_a_job_stops_calling(run: Run) -> None:
    (rule,) = [rule for rule in alert_rules() if rule["alert"] == "LLMNoRequests"]
    wait_for(
        lambda: query(run, 'http_client_request_duration_seconds_count{job="e2e-alerts"}'),
        timeout=60,
        what="the e2e-alerts job's requests",
    )
    jobs_now = {series["metric"]["job"] for series in query(run, rule["expr"])}
    assert "e2e-alerts" not in jobs_now  # it is calling
    # The same series, read 16 minutes on: as Prometheus will see them if the job stops now.
    later = {series["metric"]["job"] for series in query(run, rule["expr"], time.time() + 16 * 60)}
    assert "e2e-alerts" in later


def test_an_alert_reaches_alertmanager(run: Run) -> None:
    """The test's override of LLMRateLimited (`for: 0s`, conftest.py) fires and is received."""

    def received() -> list[dict[str, Any]]:
        alerts = get_json(run.bundle.url("alertmanager", 9093, "/api/v2/alerts"))
        return [alert for alert in alerts if alert["labels"]["alertname"] == "LLMRateLimitedNow"]

    alerts = wait_for(received, timeout=ALERT_SECONDS + 60, interval=3, what="the alert")
    hosts = {alert["labels"]["server_address"] for alert in alerts}
    # every host with more than 5 % of 429s: the scenario's, and those whose retried calls got one
    assert "rate-limited.test" in hosts and "healthy.test" not in hosts
    assert all(alert["labels"]["job"] == "e2e-alerts" for alert in alerts)
    assert all(alert["annotations"]["runbook"] for alert in alerts)


@pytest.fixture(scope="module")
def alerts_done(run: Run) -> Run:
    run.alerts.wait(timeout=ALERT_SECONDS + 120)
    for workload in run.calls.values():
        workload.wait(timeout=60)
    time.sleep(20)  # a scrape (15 s) after the last export
    return run


def _queries() -> list[Query]:
    return dashboard_queries() + datasource_queries()


#: Grafana's variables as in tests/deploy_workload.py; a span's own host ($__tags, in the Jaeger
#: datasource's trace-to-metrics links) is the mock server of the ``calls`` workload, whose
#: spans have every kind of data those links ask for (streams, retries, phases).
VARIABLES = {**GRAFANA_VARIABLES, "__tags": 'server_address="127.0.0.1"'}


@pytest.mark.parametrize("panel", _queries(), ids=lambda q: q.where)
def test_every_dashboard_query_returns_data(alerts_done: Run, panel: Query) -> None:
    result = query(alerts_done, substitute(panel.expr, VARIABLES))
    assert result, f"{panel.where}: no data for {panel.promql}"
