"""The bundle's side of ``llm-latency watch``: the compose service and its endpoints file, the
Helm values (one Deployment per region), the "Endpoints from here" dashboard and the two probe
alerts, checked with promtool and against a real Prometheus that scrapes a real probe."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_latency.cli.monitor_config import load_config
from tests.command_line import CLI, environment, mock_server
from tests.processes import die_with_parent
from tests.servers import unused_port
from tests.test_deploy_prometheus import Prometheus

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose"
RULES = COMPOSE / "prometheus" / "rules" / "llm-latency-probe.rules.yaml"
RULES_TEST = COMPOSE / "prometheus" / "tests" / "llm-latency-probe.rules.test.yaml"
DASHBOARD = COMPOSE / "grafana" / "dashboards" / "llm-latency-probe.json"
HELM_VALUES = DEPLOY / "helm" / "probe" / "values.yaml"
HELM_TEMPLATE = DEPLOY / "helm" / "probe" / "templates" / "deployments.yaml"
README = DEPLOY / "README.md"
#: Grafana's variables, as a query sees them with "All" chosen.
VARIABLES = {"$probe_job": ".+", "$endpoint": ".+", "$__rate_interval": "30s"}


def alerts() -> list[dict[str, Any]]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            queries.append((f"{panel['title']} {target['refId']}", expr))
    return queries


def test_the_probe_rules_are_valid_and_pass_their_unit_tests() -> None:
    checked = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True,
                             text=True, check=False)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "2 rules found" in checked.stdout
    tested = subprocess.run(["promtool", "test", "rules", str(RULES_TEST)], capture_output=True,
                            text=True, check=False)  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_each_probe_alert_has_a_runbook_in_the_rule_and_in_the_readme() -> None:
    headings = set(re.findall(r"^### (\w+)$", README.read_text(), re.MULTILINE))
    assert {rule["alert"] for rule in alerts()} == {
        "LLMEndpointDown",
        "LLMEndpointSlowerThanBaseline",
    }
    for rule in alerts():
        name = rule["alert"]
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), name
        assert f"deploy/README.md#{name.lower()}" in rule["annotations"]["runbook"], name
        assert name in headings, f"deploy/README.md has no '### {name}' section"


def test_the_compose_probe_runs_watch_on_its_file_into_the_collector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = yaml.safe_load((COMPOSE / "docker-compose.yaml").read_text())["services"]["probe"]
    assert service["command"][-1].endswith(
        "&& exec llm-latency watch /etc/llm-latency/endpoints.toml"
    )
    assert "./probe/endpoints.toml:/etc/llm-latency/endpoints.toml:ro" in service["volumes"]
    assert service["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318"
    assert service["profiles"] == ["probe"]  # opt-in: it spends the user's keys
    # keys are only passed through from the environment, never written
    for name, value in service["environment"].items():
        if name.endswith("_API_KEY"):
            assert value == f"${{{name}:-}}", name
    # the file it mounts is one `watch` accepts
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    config = load_config(str(COMPOSE / "probe" / "endpoints.toml"))
    assert [e.name for e in config.endpoints] == ["openai"]


def test_the_helm_chart_makes_one_deployment_per_region() -> None:
    values = yaml.safe_load(HELM_VALUES.read_text())
    regions = [region["name"] for region in values["regions"]]
    assert len(regions) == len(set(regions)) >= 2
    assert all(region["nodeSelector"] for region in values["regions"])
    template = HELM_TEMPLATE.read_text()
    assert template.startswith("{{- range $region := .Values.regions }}")
    assert template.count("kind: Deployment") == 1
    assert "labels = { region = {{ $region.name | quote }} }" in template
    assert "replicas: 1" in template
    for endpoint in values["endpoints"]:
        assert "api_key" not in endpoint  # the key is in the Secret, by name


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """A real Prometheus scraping a real ``llm-latency watch`` every second: one endpoint that
    answers, one that refuses connections."""
    directory = tmp_path_factory.mktemp("probe-prometheus")
    port = unused_port()
    with mock_server("--ttfb", "0.01", "--tokens", "2") as mock:
        base = mock.url.rsplit("/v1/", 1)[0] + "/v1"
        config = directory / "endpoints.toml"
        config.write_text(
            '[monitor]\nevery = "1s"\nmin_interval = "1s"\n\n'
            f'[[endpoint]]\nname = "local"\nurl = "{base}"\nprovider = "openai-compatible"\n'
            'labels = { region = "loopback" }\n\n'
            f'[[endpoint]]\nname = "refused"\nurl = "http://127.0.0.1:{unused_port()}/v1"\n'
            'provider = "openai-compatible"\nlabels = { region = "loopback" }\n'
        )
        probe = subprocess.Popen([*CLI, "watch", str(config), "--prometheus", str(port)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 env=environment(), preexec_fn=die_with_parent)  # fmt: skip
        server = Prometheus(directory, port, job="llm-latency-probe")
        try:
            server.wait_ready()
            yield server
        finally:
            server.stop()
            probe.terminate()
            probe.wait(timeout=30)


def _answers(prometheus: Prometheus, queries: list[str], seconds: float = 60) -> dict[str, Any]:
    results: dict[str, Any] = {}
    deadline = time.monotonic() + seconds
    while True:
        for promql in queries:
            if not results.get(promql):
                results[promql] = prometheus.query(promql)
        if all(results.values()) or time.monotonic() > deadline:
            return results
        time.sleep(1)


def test_every_dashboard_query_returns_data_from_a_real_probe(prometheus: Prometheus) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 6
    answers = _answers(prometheus, [promql for _, promql in queries])
    for where, promql in queries:
        assert answers[promql], f"{where}: no data for {promql}"
    # edge and inference are separate series, per endpoint
    kinds = prometheus.query("count by (llm_latency_probe_kind) (llm_latency_probe_up)")
    assert {r["metric"]["llm_latency_probe_kind"] for r in kinds} == {"edge", "inference"}


def test_the_alert_expressions_on_real_series(prometheus: Prometheus) -> None:
    (down,) = [rule["expr"] for rule in alerts() if rule["alert"] == "LLMEndpointDown"]
    (slower,) = [
        rule["expr"] for rule in alerts() if rule["alert"] == "LLMEndpointSlowerThanBaseline"
    ]
    found = _answers(prometheus, [down])[down]
    assert {r["metric"]["llm_latency_probe_endpoint"] for r in found} == {"refused"}
    assert {r["metric"]["region"] for r in found} == {"loopback"}
    # the baseline needs a day of series: here its two sides are checked to have data
    for side in slower.split("> 3 *"):
        assert _answers(prometheus, [side.strip()])[side.strip()], side
