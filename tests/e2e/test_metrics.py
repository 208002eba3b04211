"""Prometheus, scraping the real Collector: the dashboard's queries, the alert rules on live
series, and an alert that reaches Alertmanager."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from llm_latency.semconv import GenAINames
from llm_latency.settings import genai_names
from tests.deploy_workload import (
    GRAFANA_VARIABLES,
    Query,
    alert_rules,
    dashboard_queries,
    data_checks,
    datasource_queries,
    substitute,
)
from tests.e2e.bundle import get_json, wait_for
from tests.e2e.conftest import ALERT_SECONDS, Run, report
from tests.e2e.workload import DECODE_LINE, SLOWING_MODEL, STEADY_MODEL

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


def scenarios_end(run: Run) -> float:
    """A time (epoch s) within the alert scenarios' last seconds, when what they make current
    (a gauge, the findings service's window) still showed in Prometheus."""
    return run.alerts.started + ALERT_SECONDS - 5


def hosts(result: list[dict[str, Any]], job: str = "e2e-alerts") -> set[str]:
    return {
        series["metric"].get("server_address", "")
        for series in result
        if series["metric"].get("job") == job
    }


#: The alerts that compare an endpoint with its own past (a day before), which a run of minutes
#: does not have: the scenario (host, model) whose expression, with its windows scaled to the
#: run, is true (see its own test). LLMNoRequests: see its own test too.
BASELINES = {"LLMTimePerOutputTokenRegressed": ("slow-decode.test", SLOWING_MODEL)}


#: The GenAI series of each choice of names (``OTEL_SEMCONV_STABILITY_OPT_IN`` in the run's
#: environment, which the workloads inherit: ``make e2e`` runs this file under each).
GENAI_SERIES = {
    "old": (
        "gen_ai_client_operation_time_to_first_chunk_seconds_bucket",
        "gen_ai_client_token_usage_sum",
    ),
    "latest": (
        "gen_ai_client_inference_time_to_first_chunk_seconds_bucket",
        "gen_ai_client_inference_usage_output_tokens_total",
        "gen_ai_client_inference_operation_output_tokens_sum",
    ),
}


def test_the_genai_series_are_those_the_opt_in_asks_for(alerts_done: Run) -> None:
    """Under the opt-in the released names reach Prometheus and the old ones do not (both
    with /dup); without it, the reverse. The dashboard's queries and the alerts, checked by
    the other tests of this file, then run on these series."""
    names = genai_names()
    wanted = {
        GenAINames.OLD: GENAI_SERIES["old"],
        GenAINames.LATEST: GENAI_SERIES["latest"],
        GenAINames.DUP: GENAI_SERIES["old"] + GENAI_SERIES["latest"],
    }[names]
    for series in (*GENAI_SERIES["old"], *GENAI_SERIES["latest"]):
        found = query(alerts_done, f'{series}{{job="e2e-alerts", otel_scope_name="llm_latency"}}')
        assert bool(found) == (series in wanted), (names, series)
    report(f"GenAI names {names.value}: {', '.join(wanted)} in Prometheus, not the others")


def test_every_alert_is_checked_here() -> None:
    assert {rule["alert"] for rule in alert_rules()} == {*FIRES_ON, *BASELINES, "LLMNoRequests"}


@pytest.mark.parametrize("alert", sorted(FIRES_ON))
def test_the_scenario_of_each_alert_makes_its_expression_true(run: Run, alert: str) -> None:
    (rule,) = [rule for rule in alert_rules() if rule["alert"] == alert]
    scenario = FIRES_ON[alert]

    def evaluated() -> list[dict[str, Any]]:
        # As Prometheus evaluates the rule while the scenarios run: a gauge's alert (the pool's
        # waiting requests) is true only then, and the tests before this one may outlast them
        # on a loaded machine (the pool scenario ended 150 s in, before this test began).
        return query(run, rule["expr"], min(time.time(), scenarios_end(run)))

    found = wait_for(
        lambda: scenario in (seen := hosts(evaluated())) and seen,
        timeout=ALERT_SECONDS + 60,
        interval=3,
        what=f"{alert} on {scenario}",
    )
    assert "healthy.test" not in found
    report(f"{alert}: expression true for {', '.join(sorted(found))}")


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
    report(f"Alertmanager received LLMRateLimitedNow (for: 0s) for {', '.join(sorted(hosts))}")
    (scenario,) = [
        alert for alert in alerts if alert["labels"]["server_address"] == "rate-limited.test"
    ]
    assert scenario["labels"]["job"] == "e2e-alerts"
    assert all(alert["annotations"]["runbook"] for alert in alerts)


def scaled(expr: str, recent: str, offset: str, baseline: str) -> str:
    """LLMTimePerOutputTokenRegressed's expression with its windows replaced: the last 30
    minutes by ``recent``, the offset of its baseline by ``offset``, the day before by
    ``baseline``. The thresholds stay."""
    windows = {"[30m]": f"[{recent}]", "offset 30m": f"offset {offset}", "[1d]": f"[{baseline}]"}
    for old, new in windows.items():
        assert old in expr, old
        expr = expr.replace(old, new)
    return expr


def decode_phases(run: Run) -> tuple[float, float, float]:
    """When the slow-decode scenario started, when slowing-model slowed down, when it ended."""
    pattern = re.escape(DECODE_LINE).replace(re.escape("{start:.3f}"), r"([\d.]+)")
    pattern = pattern.replace(re.escape("{slower:.3f}"), r"([\d.]+)")
    pattern = pattern.replace(re.escape("{end:.3f}"), r"([\d.]+)")
    match = re.search(pattern, run.alerts.log_text())
    assert match, f"no {DECODE_LINE!r} in the alerts workload's log"
    start, slower, end = (float(value) for value in match.groups())
    return start, slower, end


def test_time_per_output_token_regressed_is_true_for_the_slowed_model(alerts_done: Run) -> None:
    """The real expression evaluates on the real series (and is false: no day of baseline);
    with its windows scaled to the run, evaluated at the end of the run, it is true for the
    model that slowed and not for the steady one at the same host. The recent window is the
    slow half (from 2 s after the slowdown: one export), the baseline the fast half before it."""
    import promql_parser

    (rule,) = [r for r in alert_rules() if r["alert"] == "LLMTimePerOutputTokenRegressed"]
    host, model = BASELINES["LLMTimePerOutputTokenRegressed"]
    assert query(alerts_done, rule["expr"]) == []
    start, slower, end = decode_phases(alerts_done)
    at = end + 15  # a scrape (15 s) after the last answer
    recent = f"{round((at - slower - 2) * 1000)}ms"
    baseline = f"{round((slower + 2 - start) * 1000)}ms"
    expr = scaled(rule["expr"], recent, recent, baseline)
    result = query(alerts_done, expr, at)
    fired = {
        (series["metric"]["server_address"], series["metric"]["gen_ai_response_model"])
        for series in result
        if series["metric"].get("job") == "e2e-alerts"
    }
    assert (host, model) in fired, (expr, result)
    assert (host, STEADY_MODEL) not in fired
    ratio_expr = str(data_checks(promql_parser.parse(expr))[0])
    ratios = {
        series["metric"]["gen_ai_response_model"]: float(series["value"][1])
        for series in query(alerts_done, ratio_expr, at)
        if series["metric"].get("server_address") == host
    }
    assert ratios[STEADY_MODEL] < 1.5 < ratios[model], ratios
    report(
        f"LLMTimePerOutputTokenRegressed (recent {recent}, baseline {baseline} before it): "
        f"expression true for {model} at {host} ({ratios[model]:.2f}x), "
        f"not for {STEADY_MODEL} ({ratios[STEADY_MODEL]:.2f}x)"
    )


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
    promql = substitute(panel.expr, VARIABLES)
    # Now, or as the dashboard showed it while the scenarios ran: a panel of what is current
    # (the findings service's fixes, whose window forgets calls after a minute) is empty once
    # the tests before this one have outlasted it on a loaded machine.
    result = query(alerts_done, promql) or query(alerts_done, promql, scenarios_end(alerts_done))
    assert result, f"{panel.where}: no data for {panel.promql}"
