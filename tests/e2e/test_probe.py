"""The bundle's probe service run for real: compose's ``probe`` command (``llm-latency watch`` on
its endpoints file) with compose's environment, sending OTLP to the real Collector, whose series
the real Prometheus scrapes and evaluates the probe alerts on; the "Endpoints from here"
dashboard's queries return data from them.

The service's image pip-installs llm-latency; here the same command runs from the repository's
virtual environment, on an endpoints file of the test's (a loopback mock server, and an endpoint
that refuses connections) in place of the mounted one.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.command_line import environment, mock_server
from tests.e2e.bundle import ADDRESSES, COMPOSE, compose_services, get_json, wait_for
from tests.e2e.conftest import Run, report
from tests.servers import unused_port

DASHBOARD = COMPOSE / "grafana" / "dashboards" / "llm-latency-probe.json"
PROBE_RULES = COMPOSE / "prometheus" / "rules" / "llm-latency-probe.rules.yaml"
MOUNTED = "/etc/llm-latency/endpoints.toml"
VARIABLES = {"$probe_job": "llm-latency-probe", "$endpoint": ".+", "$__rate_interval": "1m"}


def query(run: Run, promql: str) -> list[dict[str, Any]]:
    answer = get_json(run.bundle.url("prometheus", 9090, "/api/v1/query"), {"query": promql})
    assert answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def _command(config: Path) -> list[str]:
    """Compose's probe command: what follows ``exec`` in its shell line, the mounted file
    replaced by the test's."""
    line = compose_services()["probe"]["command"][-1]
    words = shlex.split(line.split("&& exec ", 1)[1])
    assert words[:2] == ["llm-latency", "watch"], words
    return [
        sys.executable, "-m", "llm_latency.cli",
        *(str(config) if word == MOUNTED else word for word in words[1:]),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def probe(run: Run) -> Iterator[Run]:
    spec = compose_services()["probe"]
    env = {k: str(v) for k, v in spec["environment"].items() if not k.endswith("_API_KEY")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://{ADDRESSES['otel-collector']}:4318"
    env["OTEL_METRIC_EXPORT_INTERVAL"] = "5000"
    config = run.directory / "endpoints.toml"
    log = run.directory / "probe.log"
    with mock_server("--ttfb", "0.05", "--tokens", "3") as mock:
        base = mock.url.rsplit("/v1/", 1)[0] + "/v1"
        config.write_text(
            '[monitor]\nevery = "2s"\nmin_interval = "1s"\n\n'
            f'[[endpoint]]\nname = "local"\nurl = "{base}"\nprovider = "openai-compatible"\n'
            'labels = { region = "e2e" }\n\n'
            f'[[endpoint]]\nname = "refused"\nurl = "http://127.0.0.1:{unused_port()}/v1"\n'
            'provider = "openai-compatible"\nlabels = { region = "e2e" }\n'
        )
        with log.open("w") as out:
            process = subprocess.Popen(_command(config), stdout=out, stderr=subprocess.STDOUT,
                                       env=environment(**env))  # fmt: skip
        try:
            yield run
        finally:
            process.terminate()
            code = process.wait(timeout=30)
            assert code == 0, log.read_text()[-3000:]


def test_the_probe_series_reach_prometheus_through_the_collector(probe: Run) -> None:
    selector = (
        'llm_latency_probe_time_to_first_byte_seconds_bucket{job="llm-latency-probe", '
        'llm_latency_probe_endpoint="local", region="e2e"}'
    )
    found = wait_for(
        lambda: (
            {r["metric"]["llm_latency_probe_kind"] for r in query(probe, selector)}
            >= {"edge", "inference"}
        ),
        timeout=120,
        interval=3,
        what="the probe's series in Prometheus",
    )
    assert found


def test_the_probe_rules_are_loaded_and_endpoint_down_holds_for_the_refused_one(probe: Run) -> None:
    rules = get_json(probe.bundle.url("prometheus", 9090, "/api/v1/rules"))["data"]["groups"]
    (group,) = [g for g in rules if g["name"] == "llm-latency-probe"]
    assert {r["name"]: r["health"] for r in group["rules"]} == {
        "LLMEndpointDown": "ok",
        "LLMEndpointSlowerThanBaseline": "ok",
    }
    expressions = {
        r["alert"]: r["expr"]
        for g in yaml.safe_load(PROBE_RULES.read_text())["groups"]
        for r in g["rules"]
    }
    down = wait_for(
        lambda: query(probe, expressions["LLMEndpointDown"]),
        timeout=120,
        interval=3,
        what="LLMEndpointDown's expression",
    )
    assert {r["metric"]["llm_latency_probe_endpoint"] for r in down} == {"refused"}
    report(
        f"LLMEndpointDown: expression true for {sorted({r['metric']['llm_latency_probe_kind'] for r in down})} of 'refused'"
    )


def test_every_probe_dashboard_query_returns_data(probe: Run) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            result = wait_for(
                lambda expr=expr: query(probe, expr),
                timeout=120,
                interval=3,
                what=f"{panel['title']} {target['refId']}",
            )
            if panel["title"].endswith("time to first byte by endpoint"):
                numbers = ", ".join(
                    f"{r['metric'].get('llm_latency_probe_endpoint')} "
                    f"{float(r['value'][1]) * 1000:.1f} ms"
                    for r in result
                )
                quantile = {"A": "p50", "B": "p95"}[target["refId"]]
                report(f"{panel['title']}, {quantile}: {numbers}")
