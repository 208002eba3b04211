"""The dashboard's and the alert rules' queries against a real Prometheus (the Debian package)
that scrapes a real instrumented program (tests/deploy_workload.py) every second on loopback.

Every PromQL expression of the dashboard, of the Grafana datasources (trace-to-metrics links)
and of the alert rules must return data, with Grafana's variables replaced as Grafana would
($job and $server: All; $__rate_interval: 1m; $__range: 5m; $__tags: the workload's host).

An alert expression is a threshold, empty while all is well, so it cannot show that its
series exist. Each alert is taken apart instead (tests.deploy_workload.data_checks, on the
promql-parser AST): a comparison with a number is evaluated without its threshold, both sides
of ``and``/``or`` are evaluated, ``absent(x)`` evaluates ``x``. For example LLMWaitP95High
evaluates ``histogram_quantile(0.95, ...)`` without ``> 30``, and LLMNoRequests evaluates
``group by (job) (last_over_time(http_client_request_duration_seconds_count{...}[1d]))`` (the
left side of its ``unless``). A baseline read ``offset`` into the past
(LLMTimePerOutputTokenRegressed: the day before the last 30 minutes) is evaluated without its
offset: the series it reads are the same, and a short run has no past. The rules are also
loaded into this Prometheus, which must evaluate each of them without error.
"""

from __future__ import annotations

import json
import os
import re
import select
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_latency.metrics import SETUP_PHASES
from llm_latency.semconv import DURATION_BUCKETS, TOKEN_INTERVAL_BUCKETS
from llm_latency.timeline import PHASE_NAMES
from tests.deploy_workload import (
    ROOT,
    RULES_FILE,
    WORKLOAD_HOST,
    WORKLOAD_MODEL,
    WORKLOAD_TOKENS,
    WORKLOAD_TOKENS_PER_SECOND,
    Query,
    all_queries,
    data_checks,
    tool,
)
from tests.processes import die_with_parent

#: How long the whole module may wait for every query to return data.
DEADLINE_SECONDS = 40.0
#: The file, in Prometheus's directory, where the workload writes what the machine took from
#: each of its streamed answers with usage (s, one a line).
STREAM_WAITS = "stream-waits"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_workload(waits: Path) -> tuple[subprocess.Popen[str], int]:
    """The instrumented program, for at most 90 s, appending what the machine took from each
    streamed answer with usage to ``waits``; returns it and its metrics port."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.deploy_workload", "--seconds", "90", "--waits", str(waits)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=die_with_parent,
    )
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 20)
    line = process.stdout.readline() if ready else ""
    if not line.startswith("metrics http://127.0.0.1:"):
        process.kill()
        _, stderr = process.communicate(timeout=10)
        pytest.fail(f"the workload did not start: {line!r}\n{stderr}")
    port = int(line.split(":")[2].split("/")[0])
    return process, port


class Prometheus:
    """A real Prometheus on loopback that scrapes the workload (job ``job``) every second and
    evaluates the bundle's alert rules every second."""

    def __init__(self, directory: Path, target_port: int, job: str = "deploy-workload") -> None:
        self.directory = directory
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES_FILE)],
            "scrape_configs": [
                {
                    "job_name": job,
                    "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}],
                }
            ],
        }
        config_file = directory / "prometheus.yaml"
        config_file.write_text(yaml.safe_dump(config))
        self.log = (directory / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [
                tool("prometheus"),
                f"--config.file={config_file}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--enable-feature=exemplar-storage",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
        self.log_file = directory / "prometheus.log"

    def get(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)

    def wait_ready(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"prometheus exited:\n{self.log_file.read_text()}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2)
                return
            except OSError:
                time.sleep(0.2)
        pytest.fail(f"prometheus not ready after {timeout} s:\n{self.log_file.read_text()}")

    def query(self, promql: str, at: str | None = None) -> list[Any]:
        """``promql``'s result now, or at the time ``at`` (a result's timestamp)."""
        body = self.get("/api/v1/query", query=promql, **({} if at is None else {"time": at}))
        assert body["status"] == "success", body
        result = body["data"]["result"]
        if body["data"]["resultType"] in ("scalar", "string"):
            return [result]
        return list(result)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    directory = tmp_path_factory.mktemp("prometheus")
    workload, port = start_workload(directory / STREAM_WAITS)
    server = Prometheus(directory, port)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
        workload.terminate()
        try:
            workload.wait(timeout=10)
        except subprocess.TimeoutExpired:
            workload.kill()
            workload.wait()


#: The Collector's span metrics (the phases the program does not record: send, wait, receive):
#: this Prometheus scrapes the program alone, so the queries of them are checked against the
#: real Collector by tests/e2e/test_metrics.py (make e2e), not here.
SPAN_METRICS = "traces_span_metrics_"
#: The findings service's metrics (llm-latency advise): the same, checked by
#: tests/e2e/test_metrics.py against the bundle's Prometheus scraping the real service.
ADVICE_METRICS = "llm_latency_advice_"


def without_offsets(promql: str) -> str:
    """``promql`` with every ``offset`` modifier removed: a baseline of the past, read now."""
    return re.sub(r"\s+offset\s+-?[0-9][0-9a-z]*", "", promql)


def checks() -> list[tuple[Query, str]]:
    """(query, PromQL that must return data): the dashboard's and datasources' queries as they
    are; each alert as the parts of it that must have data (data_checks), without their offsets
    (:func:`without_offsets`). Not the parts that read the Collector's span metrics
    (:data:`SPAN_METRICS`) or the findings service's (:data:`ADVICE_METRICS`)."""
    import promql_parser

    result = []
    for query in all_queries():
        if query.alert:
            parsed = data_checks(promql_parser.parse(query.promql))
            parts = [without_offsets(str(part)) for part in parsed]
            result += [(query, part) for part in parts if SPAN_METRICS not in part]
        elif SPAN_METRICS not in query.promql and ADVICE_METRICS not in query.promql:
            result.append((query, query.promql))
    return result


CHECKS = checks()


def check_id(index: int) -> str:
    query, _ = CHECKS[index]
    parts = [i for i, (q, _) in enumerate(CHECKS) if q == query]
    return query.where if len(parts) == 1 else f"{query.where}, part {parts.index(index) + 1}"


@pytest.fixture(scope="module")
def answers(prometheus: Prometheus) -> dict[str, list[Any]]:
    """Every check's result, once all return data or the deadline passed (the workload needs a
    few scrapes before rates and quantiles have two samples)."""
    results: dict[str, list[Any]] = {}
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        for _, promql in CHECKS:
            if not results.get(promql):
                results[promql] = prometheus.query(promql)
        if all(results.values()) or time.monotonic() > deadline:
            return results
        time.sleep(1)


def test_alerts_are_taken_apart_into_their_series() -> None:
    """Thresholds, and/or branches and absent() are split as the module docstring says."""
    by_alert: dict[str, list[str]] = {}
    for query, promql in CHECKS:
        if query.alert:
            by_alert.setdefault(query.where, []).append(promql)
    assert len(by_alert) == 9  # LLMWaitP95High reads span metrics only: tests/e2e checks it
    for parts in by_alert.values():
        for part in parts:
            assert not part.endswith(("> 30", "> 10", "> 0.5", "< 5", "== 0", "> 0")), part
            assert not part.endswith(("> 1.5", "> 0.05", "> 0.01")) and "offset" not in part
    # "A unless B" is checked on A: the jobs remembered for a day (no absent() branch).
    assert by_alert["alert LLMNoRequests"] == [
        "group by (job)(last_over_time("
        'http_client_request_duration_seconds_count{otel_scope_name="llm_latency"}[1d]))'
    ]
    assert len(by_alert["alert LLMNewConnectionShareHigh"]) == 2
    assert len(by_alert["alert LLMRateLimitNearZero"]) == 2
    # "waiting > 0 and on (...) live > 0": the waiting requests, and the live instances' attempts.
    assert by_alert["alert LLMConnectionPoolSaturated"] == [
        "sum by (job, instance, server_address, server_port)(llm_latency_pool_waiting{})",
        'increase(http_client_request_duration_seconds_count{otel_scope_name="llm_latency"}[5m])',
    ]
    # "recent p50 / baseline p50 > 1.5 and recent rate > 0.05 and baseline rate > 0.01": the
    # ratio, the two rates; the baseline's "[1d] offset 30m" read as "[1d]".
    by = "sum by (job, server_address, gen_ai_response_model)"
    tpot = 'llm_latency_time_per_output_token_seconds_{}{{otel_scope_name="llm_latency"}}[{}]'
    p50 = f"histogram_quantile(0.5, {by[:-1]}, le)(rate({tpot})))"
    assert by_alert["alert LLMTimePerOutputTokenRegressed"] == [
        f"{p50.format('bucket', '30m')} / {p50.format('bucket', '1d')}",
        f"{by}(rate({tpot.format('count', '30m')}))",
        f"{by}(rate({tpot.format('count', '1d')}))",
    ]


@pytest.mark.parametrize(("query", "promql"), CHECKS, ids=[check_id(i) for i in range(len(CHECKS))])
def test_query_returns_data(query: Query, promql: str, answers: dict[str, list[Any]]) -> None:
    assert answers[promql], f"{query.where}: no data for {promql}"


def test_the_workload_exports_the_names_the_collector_exports(
    prometheus: Prometheus, answers: dict[str, list[Any]]
) -> None:
    """The names, labels and buckets of DESIGN.md ("Metrics"), as Prometheus stores them."""
    names = set(prometheus.get("/api/v1/label/__name__/values")["data"])
    histograms = (
        "http_client_request_duration_seconds",
        "llm_latency_phase_duration_seconds",
        "llm_latency_server_processing_time_seconds",
        "gen_ai_client_operation_time_to_first_chunk_seconds",
    )
    expected = {f"{h}_{suffix}" for h in histograms for suffix in ("bucket", "sum", "count")}
    expected |= {
        "llm_latency_retries_total",
        "llm_latency_rate_limited_total",
        "llm_latency_connections_total",
        "llm_latency_ratelimit_remaining",
    }
    assert expected <= names, sorted(expected - names)

    def values(label: str, selector: str) -> set[str]:
        return {series["metric"][label] for series in prometheus.query(selector)}

    # The connection set-up's phases only (send, wait and receive are the span metrics').
    phases = values("llm_latency_phase", "llm_latency_phase_duration_seconds_count")
    # Every set-up phase but the proxy tunnel's: the workload reaches its server directly.
    assert phases == {PHASE_NAMES[phase] for phase in SETUP_PHASES} - {"proxy"}
    assert values("llm_latency_connection_reused", "llm_latency_connections_total") == {
        "true",
        "false",
    }
    assert values("llm_latency_ratelimit_kind", "llm_latency_ratelimit_remaining") == {
        "requests",
        "tokens",
    }
    assert values("http_response_status_code", "llm_latency_retries_total") == {"429"}
    assert values("server_address", "llm_latency_rate_limited_total") == {WORKLOAD_HOST}
    request = prometheus.query("http_client_request_duration_seconds_count")[0]["metric"]
    assert {"http_request_method", "server_address", "server_port"} <= set(request)
    buckets = values("le", 'llm_latency_phase_duration_seconds_bucket{llm_latency_phase="dns"}')
    assert sorted(float(b) for b in buckets) == [*DURATION_BUCKETS, float("inf")]


def test_the_workload_exports_the_connection_pool_metrics(
    prometheus: Prometheus, answers: dict[str, list[Any]]
) -> None:
    """Issue 12's connection-pool metrics, named as the collector exports them, with their
    labels; the workload's pool is aiohttp's TCPConnector(limit=1), one at a time."""
    names = set(prometheus.get("/api/v1/label/__name__/values")["data"])
    expected = {
        "http_client_open_connections",
        "http_client_active_requests",
        "llm_latency_pool_waiting",
        "llm_latency_pool_limit",
    }
    expected |= {
        f"http_client_connection_duration_seconds_{suffix}" for suffix in ("bucket", "sum", "count")
    }
    assert expected <= names, sorted(expected - names)
    for name in expected:
        for series in prometheus.query(f"last_over_time({name}[5m])"):
            labels = series["metric"]
            assert labels["server_address"] == WORKLOAD_HOST, (name, labels)
            assert {"job", "server_port"} <= set(labels), (name, labels)
    states = {
        series["metric"]["http_connection_state"]
        for series in prometheus.query("last_over_time(http_client_open_connections[5m])")
    }
    assert "active" in states and states <= {"active", "idle"}, states
    # one series a port (the TLS server's, the mock server's), through the same pool of one
    limits = prometheus.query(
        f'min_over_time(llm_latency_pool_limit{{server_address="{WORKLOAD_HOST}"}}[5m])'
    )
    assert limits and {float(limit["value"][1]) for limit in limits} == {1.0}, limits
    (closed,) = prometheus.query("sum(http_client_connection_duration_seconds_count)")
    assert float(closed["value"][1]) > 0  # each round's session closes its connection


def test_the_workload_exports_the_token_metrics(
    prometheus: Prometheus, answers: dict[str, list[Any]]
) -> None:
    """The token usage, time per output token and time to first token of the streamed answers
    with usage, named as the collector exports them, by model and host; the token counts are
    the mock server's (its answer's length), the time per output token near its pace."""
    names = set(prometheus.get("/api/v1/label/__name__/values")["data"])
    histograms = (
        "gen_ai_client_token_usage",
        "llm_latency_time_per_output_token_seconds",
        "llm_latency_time_to_first_token_seconds",
    )
    expected = {f"{h}_{suffix}" for h in histograms for suffix in ("bucket", "sum", "count")}
    assert expected <= names, sorted(expected - names)
    for name in expected:
        for series in prometheus.query(f'{name}{{gen_ai_response_model="{WORKLOAD_MODEL}"}}'):
            labels = series["metric"]
            assert labels["server_address"] == WORKLOAD_HOST, (name, labels)
            assert labels["otel_scope_name"] == "llm_latency", (name, labels)
    model = f'{{gen_ai_response_model="{WORKLOAD_MODEL}"}}'
    usage = prometheus.query(
        f"gen_ai_client_token_usage_sum{model} / gen_ai_client_token_usage_count{model}"
    )
    per_call = {s["metric"]["gen_ai_token_type"]: float(s["value"][1]) for s in usage}
    assert per_call == {"input": 3.0, "output": float(WORKLOAD_TOKENS)}  # "count to eight"
    # The mean time per output token: about the server's pace, never less. Each interval
    # between tokens is a wake-up of the workload's loop (its client and the mock server share
    # it), which a loaded machine delays (at load 16 on 2 cores the mean was 7.5 times the
    # pace): what it took from the streams, as the workload measured it, spread over their
    # intervals, is taken out of the upper bound's side.
    (tpot,) = prometheus.query(
        "llm_latency_time_per_output_token_seconds_sum"
        " / llm_latency_time_per_output_token_seconds_count"
    )
    at, mean = tpot["value"]
    (count,) = prometheus.query("llm_latency_time_per_output_token_seconds_count", at=str(at))
    streams = int(float(count["value"][1]))
    waits = (prometheus.directory / STREAM_WAITS).read_text().split()
    assert len(waits) >= streams, (waits, streams)
    machine = sum(float(w) for w in waits[:streams]) / (streams * (WORKLOAD_TOKENS - 1))
    pace = 1 / WORKLOAD_TOKENS_PER_SECOND
    assert pace <= float(mean) < 4 * pace + machine, (tpot, f"the machine's share {machine:.4f} s")
    buckets = {
        float(series["metric"]["le"])
        for series in prometheus.query("llm_latency_time_per_output_token_seconds_bucket")
    }
    assert sorted(buckets) == [*TOKEN_INTERVAL_BUCKETS, float("inf")]


def test_prometheus_evaluates_every_rule_without_error(
    prometheus: Prometheus, answers: dict[str, list[Any]]
) -> None:
    groups = prometheus.get("/api/v1/rules")["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == 10
    for rule in rules:
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
