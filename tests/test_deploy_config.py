"""The deploy bundle's configuration (deploy/), checked with the real tools and the upstream
reference data, without a Docker engine or a cluster: docker-compose and the compose spec,
promtool (config, rules, rule unit tests), amtool, promql-parser, the collector chart's JSON
schema, the Jaeger chart's values, the collector distribution's manifest, yamllint.

The tools are installed by CI (deploy/README.md, "What was checked"); a missing one fails its
test with a message saying how to install it, it is not skipped.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import urllib.parse
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from llm_latency.metrics import SETUP_PHASES
from llm_latency.semconv import DURATION_BUCKETS
from llm_latency.timeline import PHASE_NAMES
from tests.deploy_workload import (
    ALERTMANAGER_CONFIG,
    COLLECTOR_CONFIG,
    COMPOSE,
    COMPOSE_FILE,
    DASHBOARD,
    DASHBOARD_PROVIDERS,
    DATASOURCES,
    DEPLOY,
    HELM_AGENT,
    HELM_GATEWAY,
    HELM_JAEGER,
    JAEGER_CONFIG,
    PROMETHEUS_CONFIG,
    README,
    ROOT,
    RULES_FILE,
    RULES_TEST_FILE,
    Query,
    alert_rules,
    all_queries,
    dashboard_panels,
    load_yaml,
    substitute,
    tool,
)
from tests.e2e.chart import rendered_config

JAEGER_MEMORY_CONFIG = JAEGER_CONFIG.with_name("config-memory.yaml")
REFERENCE = ROOT / "tests" / "data"  # upstream files, copied (tests/data/README.md)
MANIFEST = REFERENCE / "otelcol-contrib-0.159.0.manifest.yaml"
COLLECTOR_CHART_SCHEMA = REFERENCE / "opentelemetry-collector-chart-0.170.0.values.schema.json"
JAEGER_CHART_VALUES = REFERENCE / "jaeger-chart-4.11.1.values.yaml"


def run(*args: str, cwd: Path = ROOT) -> str:
    result = subprocess.run(
        [tool(args[0]), *args[1:]], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(args)} failed ({result.returncode}):\n{output}"
    return output


def reference(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"reference data missing: {path} (see tests/data/README.md)")
    return path


# -- compose ---------------------------------------------------------------------------------


def test_compose_file_is_valid_for_docker_compose() -> None:
    run("docker-compose", "-f", str(COMPOSE_FILE), "config", "-q")


def test_compose_file_matches_the_compose_spec() -> None:
    run("check-jsonschema", "--builtin-schema", "vendor.compose-spec", str(COMPOSE_FILE))


def test_compose_pins_every_image_and_uses_one_network() -> None:
    compose = load_yaml(COMPOSE_FILE)
    services = compose["services"]
    images = {name: service["image"] for name, service in services.items()}
    assert images["otel-collector"] == "otel/opentelemetry-collector-contrib:0.159.0"
    assert images["jaeger"] == "jaegertracing/jaeger:2.12.0"
    assert {"prometheus", "grafana", "alertmanager"} <= set(services)
    for name, image in images.items():
        repository, _, tag = image.rpartition(":")
        assert repository and re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: {image} not pinned"
    assert list(compose["networks"]) == ["llm-latency"]
    for name, service in services.items():
        assert service["networks"] == ["llm-latency"], name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE / source).exists(), f"{name} mounts missing {source}"


#: Image tags shown to be released (no registry of images is reachable from here): each with
#: the public evidence deploy/README.md ("Image tags") names. A tag that cannot be shown
#: released is not pinned.
RELEASED_IMAGES = {
    "otel-collector": "otel/opentelemetry-collector-contrib:0.159.0",
    "jaeger": "jaegertracing/jaeger:2.12.0",
    "prometheus": "prom/prometheus:v3.13.1",
    "alertmanager": "prom/alertmanager:v0.28.1",
    "grafana": "grafana/grafana:12.2.1",
    "probe": "python:3.12.8",
    "advise": "python:3.12.8",
}


def test_compose_pins_only_image_tags_shown_released_and_the_readme_says_where() -> None:
    services = load_yaml(COMPOSE_FILE)["services"]
    images = {name: service["image"] for name, service in services.items()}
    assert images == RELEASED_IMAGES
    section = README.read_text().split("### Image tags", 1)[1].split("\n## ", 1)[0]
    for image in images.values():
        (row,) = [line for line in section.splitlines() if f"`{image}`" in line]
        assert row.count("|") == 3 and row.split("|")[2].strip(), row  # a source is named


def test_compose_publishes_the_documented_ports_on_loopback_only() -> None:
    services = load_yaml(COMPOSE_FILE)["services"]
    published = {
        int(port.split(":")[1]): name
        for name, service in services.items()
        for port in service.get("ports", [])
    }
    assert {4317, 4318, 3000, 16686, 9090, 9093} <= set(published)
    for service in services.values():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), port


#: How the compose configurations name the address they listen on: every address in the
#: compose network unless the environment names one (make e2e gives each service its own).
LISTEN_HOSTS = {
    "collector": "${env:OTELCOL_LISTEN_HOST:-0.0.0.0}",
    "jaeger": "${env:JAEGER_LISTEN_HOST:-0.0.0.0}",
}


def listening_endpoints(config: dict[str, Any]) -> dict[str, str]:
    """Where a collector or Jaeger configuration listens, by component path: every endpoint of
    its receivers and extensions (Jaeger's storage extension only connects out), its prometheus
    exporter's, and the host of its own metrics' reader."""
    found: dict[str, str] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("endpoint", "host") and isinstance(value, str):
                    found[f"{path}.{key}"] = value
                else:
                    walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{path}[{index}]")

    for kind in ("receivers", "extensions"):
        for name, settings in (config.get(kind) or {}).items():
            if name != "jaeger_storage":
                walk(settings, f"{kind}.{name}")
    for name, settings in (config.get("exporters") or {}).items():
        if name.split("/")[0] == "prometheus":
            walk(settings, f"exporters.{name}")
    walk(config["service"]["telemetry"], "service.telemetry")
    return found


@pytest.mark.parametrize(
    ("where", "path"),
    [
        ("collector", COLLECTOR_CONFIG),
        ("jaeger", JAEGER_CONFIG),
        ("jaeger", JAEGER_MEMORY_CONFIG),
    ],
    ids=["collector", "jaeger", "jaeger memory"],
)
def test_compose_configs_listen_on_the_address_the_environment_names(
    where: str, path: Path
) -> None:
    """make e2e gives each service a loopback address of its own through the environment, and
    tests/e2e/test_listening.py checks the sockets: each endpoint must read it."""
    endpoints = listening_endpoints(load_yaml(path))
    assert len(endpoints) >= 5, endpoints  # OTLP gRPC and HTTP, health, metrics, ...
    host = LISTEN_HOSTS[where]
    wrong = {
        component: value
        for component, value in endpoints.items()
        if value != host and not re.fullmatch(re.escape(host) + r":\d+", value)
    }
    assert not wrong, wrong


def test_compose_alertmanager_opens_no_cluster_port() -> None:
    """One Alertmanager needs no gossip: without --cluster.listen-address= it would listen on
    every address, port 9094 (TCP and UDP)."""
    command = load_yaml(COMPOSE_FILE)["services"]["alertmanager"]["command"]
    assert "--cluster.listen-address=" in command, command


# -- Jaeger's storage ------------------------------------------------------------------------


def jaeger_backends(config: dict[str, Any]) -> dict[str, Any]:
    """The settings of the backend a Jaeger configuration stores the traces in, by kind."""
    store = config["exporters"]["jaeger_storage_exporter"]["trace_storage"]
    assert config["extensions"]["jaeger_query"]["storage"]["traces"] == store
    backend: dict[str, Any] = config["extensions"]["jaeger_storage"]["backends"][store]
    return backend


def test_compose_jaeger_stores_traces_in_badger_in_a_volume_for_7_days() -> None:
    """Traces outlive a restart of Jaeger (tests/e2e/test_faults.py restarts it) and are
    deleted after ttl.spans (tests/e2e/test_storage.py shows the expiry)."""
    (badger,) = jaeger_backends(load_yaml(JAEGER_CONFIG)).values()
    assert badger["ephemeral"] is False
    assert badger["consistency"] is True  # each write synced
    assert badger["ttl"]["spans"] == "168h"
    folder = r"\$\{env:JAEGER_BADGER_DIR:-(/[\w/]+)\}"
    defaults = set()
    for kind in ("keys", "values"):
        match = re.fullmatch(folder + "/" + kind, badger["directories"][kind])
        assert match, badger["directories"]
        defaults.add(match.group(1))
    (default,) = defaults
    compose = load_yaml(COMPOSE_FILE)
    jaeger = compose["services"]["jaeger"]
    mounts = dict(volume.split(":")[:2] for volume in jaeger["volumes"])
    assert mounts["jaeger-data"] == "/tmp" and default.startswith("/tmp/")  # in the volume
    assert "jaeger-data" in compose["volumes"]
    # the new process opens the database once the old one has exited: a stop, not a kill
    assert jaeger["stop_grace_period"] == "30s" and jaeger["restart"] == "unless-stopped"


def test_compose_jaeger_config_is_chosen_by_jaeger_config_and_defaults_to_badger() -> None:
    jaeger = load_yaml(COMPOSE_FILE)["services"]["jaeger"]
    assert jaeger["command"] == ["--config=/etc/jaeger/${JAEGER_CONFIG:-config.yaml}"]
    assert "./jaeger:/etc/jaeger:ro" in jaeger["volumes"]
    assert JAEGER_CONFIG.name == "config.yaml"
    (kind,) = jaeger_backends(load_yaml(JAEGER_CONFIG))
    assert kind == "badger"


def test_jaeger_memory_config_is_the_badger_one_with_memory_storage() -> None:
    badger, memory = load_yaml(JAEGER_CONFIG), load_yaml(JAEGER_MEMORY_CONFIG)
    assert jaeger_backends(memory) == {"memory": {"max_traces": 100000}}
    store = memory["exporters"]["jaeger_storage_exporter"]["trace_storage"]
    badger["extensions"]["jaeger_storage"]["backends"][store] = jaeger_backends(memory)
    assert badger == memory


# -- Prometheus and Alertmanager ------------------------------------------------------------


def test_prometheus_config_is_valid() -> None:
    output = run("promtool", "check", "config", str(PROMETHEUS_CONFIG))
    # the programs' rules, the probe's and the findings service's
    assert "3 rule files found" in output


def test_alerting_rules_are_valid() -> None:
    output = run("promtool", "check", "rules", str(RULES_FILE))
    assert f"{len(alert_rules())} rules found" in output


def test_alerting_rules_pass_their_unit_tests() -> None:
    run("promtool", "test", "rules", str(RULES_TEST_FILE))


ADVICE_RULES = COMPOSE / "prometheus" / "rules" / "llm-latency-advice.rules.yaml"
ADVICE_RULES_TEST = COMPOSE / "prometheus" / "tests" / "llm-latency-advice.rules.test.yaml"


def test_the_findings_services_alert_is_valid_tested_and_documented() -> None:
    """LLMFixWouldSave (the findings service's rules): valid, its promtool unit tests pass, it
    reads the metrics the service exports, and deploy/README.md has its runbook."""
    output = run("promtool", "check", "rules", str(ADVICE_RULES))
    assert "1 rules found" in output
    run("promtool", "test", "rules", str(ADVICE_RULES_TEST))
    (rule,) = [r for g in load_yaml(ADVICE_RULES)["groups"] for r in g["rules"]]
    assert rule["alert"] == "LLMFixWouldSave" and rule["for"] == "15m"
    text = " ".join(str(value) for value in rule["annotations"].values()) + rule["expr"]
    assert set(re.findall(r"llm_latency_advice_\w+", text)) <= ADVICE_METRICS
    assert "deploy/README.md#llmfixwouldsave" in " ".join(rule["annotations"]["runbook"].split())
    assert "### LLMFixWouldSave" in README.read_text()


def test_the_advice_metrics_are_those_the_service_exports() -> None:
    from llm_latency.advise.advisor import Advice, Snapshot
    from llm_latency.advise.exposition import exposition
    from llm_latency.diagnosis import Evidence, Finding

    finding = Finding("pool-queue", "cause", Evidence("http.queue", 0.5, 1, 2, 3, 4), "fix", None)
    text = exposition(Snapshot(advice=(Advice("app", "h", finding, 1, 0.5, 2, 4, 60),)))
    exported = set(re.findall(r"^(llm_latency_advice_\w+)\{", text, re.MULTILINE))
    assert exported >= ADVICE_METRICS


def test_every_alert_has_a_unit_test_that_fires_on_a_bad_series_and_not_on_a_good_one() -> None:
    """Each alert has a test that expects it to fire, whose input also has a series that it must
    not fire for (another host, program or phase: the test's expected alerts list every alert
    that fires), and a test time where it is silent."""
    tests = load_yaml(RULES_TEST_FILE)["tests"]
    assert load_yaml(RULES_TEST_FILE)["rule_files"] == ["../rules/llm-latency.rules.yaml"]
    for rule in alert_rules():
        name = rule["alert"]
        fires_beside_a_good_series = silent = False
        for group in tests:
            series = [
                dict(re.findall(r'(\w+)="([^"]*)"', s["series"]))
                for s in group.get("input_series", [])
            ]
            for case in group.get("alert_rule_test", []):
                if case["alertname"] != name:
                    continue
                if not case["exp_alerts"]:
                    silent = True
                    continue
                expected = [
                    {k: v for k, v in alert["exp_labels"].items() if k != "severity"}
                    for alert in case["exp_alerts"]
                ]
                keys = set(expected[0])
                for labels in series:
                    if keys and keys <= set(labels):
                        projected = {key: labels[key] for key in keys}
                        fires_beside_a_good_series |= projected not in expected
        assert fires_beside_a_good_series, f"{name}: no test where it fires beside a good series"
        assert silent, f"{name}: no test where it stays silent"


def test_every_alert_has_a_runbook_in_the_rule_and_in_the_readme() -> None:
    readme = README.read_text()
    headings = set(re.findall(r"^### (\w+)$", readme, re.MULTILINE))
    for rule in alert_rules():
        name = rule["alert"]
        annotations = rule["annotations"]
        assert {"summary", "description", "runbook"} <= set(annotations), name
        assert f"deploy/README.md#{name.lower()}" in annotations["runbook"], name
        assert name in headings, f"deploy/README.md has no '### {name}' section"
        assert rule["labels"]["severity"] in ("warning", "critical"), name


def test_alertmanager_config_is_valid() -> None:
    run("amtool", "check-config", str(ALERTMANAGER_CONFIG))


# -- PromQL ----------------------------------------------------------------------------------


@pytest.mark.parametrize("query", all_queries(), ids=lambda q: q.where)
def test_every_promql_expression_parses(query: Query) -> None:
    import promql_parser

    promql_parser.parse(query.promql)


#: The metrics of the contract (README, "Metrics"), as the collector's prometheus exporter names
#: them: the histograms (each with _bucket, _sum and _count), the counters, the gauges.
CONTRACT_HISTOGRAMS = (
    "http_client_request_duration_seconds",
    "llm_latency_phase_duration_seconds",
    "llm_latency_server_processing_time_seconds",
    "gen_ai_client_operation_time_to_first_chunk_seconds",
    "gen_ai_client_inference_time_to_first_chunk_seconds",
    "http_client_connection_duration_seconds",
    "llm_latency_event_loop_lag_seconds",
    "gen_ai_client_token_usage",
    "llm_latency_time_per_output_token_seconds",
    "llm_latency_time_to_first_token_seconds",
)
CONTRACT_SERIES = (
    "gen_ai_client_inference_usage_input_tokens_total",
    "gen_ai_client_inference_usage_output_tokens_total",
    "llm_latency_retries_total",
    "llm_latency_rate_limited_total",
    "llm_latency_connections_total",
    "llm_latency_ratelimit_remaining",
    "http_client_open_connections",
    "http_client_active_requests",
    "llm_latency_pool_waiting",
    "llm_latency_pool_limit",
)
CONTRACT_METRICS = {
    f"{histogram}_{suffix}"
    for histogram in CONTRACT_HISTOGRAMS
    for suffix in ("bucket", "sum", "count")
} | set(CONTRACT_SERIES)

#: The histogram the Collector's span metrics connector computes from every span (in ms, named
#: by its namespace): where the phases the program does not record (send, wait, receive) live.
SPAN_METRICS = {
    f"traces_span_metrics_duration_milliseconds_{suffix}" for suffix in ("bucket", "sum", "count")
}

#: The metrics with semantic-convention names, which other instrumentations (and the bundle's own
#: components) may record too.
SEMANTIC_CONVENTION_METRICS = (
    "http_client_request_duration_seconds",
    "gen_ai_client_operation_time_to_first_chunk_seconds",
    "http_client_connection_duration_seconds",
    "http_client_open_connections",
    "http_client_active_requests",
    "gen_ai_client_token_usage",
    "gen_ai_client_inference_time_to_first_chunk_seconds",
    "gen_ai_client_inference_usage_input_tokens_total",
    "gen_ai_client_inference_usage_output_tokens_total",
)


def selected_metrics(query: Query) -> set[str]:
    """The metric names a query selects (promql-parser AST: every vector selector)."""
    import promql_parser

    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name is not None, f"a selector without a metric name in {query.promql}"
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(query.promql), visit)
    return names


def test_the_queries_cover_every_metric_of_the_contract() -> None:
    text = " ".join(q.expr for q in all_queries())
    for name in (*CONTRACT_HISTOGRAMS, *CONTRACT_SERIES):
        assert name in text, name


#: The findings service's metrics (llm-latency advise: src/llm_latency/advise/exposition.py),
#: which the dashboard's "What to fix now" row reads.
ADVICE_METRICS = {
    "llm_latency_advice_saving_ratio",
    "llm_latency_advice_saving_seconds_per_minute",
    "llm_latency_advice_evidence",
    "llm_latency_advice_finding_info",
}


def test_the_queries_select_only_metrics_of_the_contract() -> None:
    """A misspelt name returns no data and raises no error: every metric a query selects is one
    the program (or the findings service) exports."""
    for query in all_queries():
        unknown = selected_metrics(query) - CONTRACT_METRICS - SPAN_METRICS - ADVICE_METRICS
        assert not unknown, (query.where, sorted(unknown))


def test_the_phases_the_program_does_not_record_are_read_from_span_metrics() -> None:
    """llm_latency_phase_duration_seconds has only the connection set-up's phases (queue, dns,
    connect, tls; DESIGN.md, "Metrics"): a query of it names those phases, and send, wait and
    receive are read from the span metrics of the http.* phase spans."""
    recorded = {PHASE_NAMES[phase] for phase in SETUP_PHASES}
    from_spans = 0
    for query in all_queries():
        names = selected_metrics(query)
        if any(name.startswith("llm_latency_phase_duration_seconds_") for name in names):
            phases = re.findall(r'llm_latency_phase(?:=~|=)"([^"]*)"', query.expr)
            assert phases, (query.where, "every phase of the histogram, but it has only some")
            for phase in phases:
                assert set(phase.split("|")) <= recorded, (query.where, phase)
        if names & SPAN_METRICS:
            from_spans += 1
            spans = re.findall(r'span_name(?:=~|=)"([^"]*)"', query.expr)
            assert spans, (query.where, "span metrics of every span, not the phases'")
            for span in spans:
                named = set(span.removeprefix("http.").strip("()").split("|"))
                assert span.startswith("http.") and named <= {*PHASE_NAMES, "proxy"}, span
    assert from_spans >= 5  # the phase panels, wait vs processing, the link, LLMWaitP95High


def test_the_queries_select_only_phases_of_the_program() -> None:
    """llm_latency_phase values are the bare phase names ("queue"), not the span names
    ("http.queue"): a wrong value returns no data."""
    for query in all_queries():
        for match in re.finditer(r'llm_latency_phase(=~|=)"([^"]*)"', query.expr):
            phases = match.group(2).split("|") if match.group(1) == "=~" else [match.group(2)]
            assert set(phases) <= set(PHASE_NAMES), (query.where, match.group(0))


def test_semantic_convention_metrics_are_selected_by_llm_latency_scope() -> None:
    """http.client.request.duration, gen_ai.client.operation.time_to_first_chunk and the
    connection metrics (http.client.open_connections, .active_requests, .connection.duration)
    have names other instrumentations (and the bundle's own components) record too: every query
    selects llm-latency's by instrumentation scope."""
    shared = "|".join(SEMANTIC_CONVENTION_METRICS)
    selector = rf"\b(?:{shared})(?:_bucket|_sum|_count)?\b(\{{[^}}]*\}})?"
    found = set()
    for query in all_queries():
        for match in re.finditer(selector, query.expr):
            found.add(match.group(0).split("{")[0])
            assert match.group(1) and 'otel_scope_name="llm_latency"' in match.group(1), (
                query.where,
                match.group(0),
            )
    assert {"http_client_open_connections", "http_client_active_requests"} <= found
    assert "gen_ai_client_token_usage_sum" in found


# -- Grafana ---------------------------------------------------------------------------------


def provisioned_datasources() -> dict[str, dict[str, Any]]:
    sources = load_yaml(DATASOURCES)["datasources"]
    return {source["uid"]: source for source in sources}


def dashboard_datasource_uids(node: Any) -> set[str]:
    """Every datasource uid the dashboard names: datasource fields, and the Explore links'
    URL-encoded queries."""
    uids: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource" and isinstance(value, dict):
                uids.add(value["uid"])
            elif key == "datasource" and isinstance(value, str):
                uids.add(value)
            elif key == "url" and isinstance(value, str) and "panes=" in value:
                panes = urllib.parse.unquote(value.split("panes=", 1)[1])
                uids |= set(re.findall(r'"datasource":"([^"]+)"', panes))
                uids |= set(re.findall(r'"uid":"([^"]+)"', panes))
            else:
                uids |= dashboard_datasource_uids(value)
    elif isinstance(node, list):
        for value in node:
            uids |= dashboard_datasource_uids(value)
    return uids


def test_datasources_have_fixed_uids_and_link_traces_and_metrics() -> None:
    sources = provisioned_datasources()
    assert {"prometheus", "jaeger"} <= set(sources)
    prometheus, jaeger = sources["prometheus"], sources["jaeger"]
    assert prometheus["type"] == "prometheus" and jaeger["type"] == "jaeger"
    assert prometheus["url"] == "http://prometheus:9090"
    assert jaeger["url"] == "http://jaeger:16686"
    # exemplars (label trace_id, from the collector's prometheus exporter) open Jaeger traces
    (destination,) = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    assert destination == {**destination, "name": "trace_id", "datasourceUid": "jaeger"}
    # spans open the metrics of their host
    links = jaeger["jsonData"]["tracesToMetrics"]
    assert links["datasourceUid"] == "prometheus"
    assert {"key": "server.address", "value": "server_address"} in links["tags"]
    assert all("$__tags" in query["query"] for query in links["queries"])


def test_dashboard_refers_only_to_provisioned_datasources() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    used = dashboard_datasource_uids(dashboard) - {"-- Grafana --"}
    assert used == {"prometheus", "jaeger"}
    assert used <= set(provisioned_datasources())


def test_dashboard_is_provisioned_where_compose_mounts_it() -> None:
    (provider,) = load_yaml(DASHBOARD_PROVIDERS)["providers"]
    grafana = load_yaml(COMPOSE_FILE)["services"]["grafana"]
    mounts = dict(volume.rsplit(":", 2)[:2] for volume in grafana["volumes"])
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"


def test_dashboard_has_the_panels_of_the_issue() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] == "Where LLM latency goes"
    titles = [panel["title"] for panel in dashboard_panels(dashboard)]
    for wanted in (
        "Time per phase, p50 (stacked)",
        "Time per phase, p95 (stacked)",
        "Wait vs server processing vs network overhead (mean)",
        "Time to first chunk (streamed responses)",
        "Retries and 429s per minute",
        "Attempts that opened a new connection (share)",
        "Rate-limit remaining",
        "Slowest hosts (over the time range)",
    ):
        assert wanted in titles
    for panel in dashboard_panels(dashboard):
        if panel["title"].startswith("Time per phase"):
            assert panel["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    (overhead,) = [p for p in dashboard_panels(dashboard) if p["title"].startswith("Wait vs")]
    wait, processing, difference, lag = (t["expr"] for t in overhead["targets"])
    assert "_sum" in wait and "_count" in wait and 'span_name="http.wait"' in wait
    assert "llm_latency_server_processing_time_seconds_sum" in processing
    assert difference == f"({wait}) - ({processing})"
    assert "llm_latency_event_loop_lag_seconds_sum" in lag and "_count" in lag


def row_panels(dashboard: dict[str, Any], title: str) -> list[dict[str, Any]]:
    """The panels of the row ``title``: inside it if it is collapsed, else those below it down
    to the next row."""
    panels = dashboard["panels"]
    (index,) = [i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == title]
    if panels[index]["collapsed"]:
        return list(panels[index]["panels"])
    following = []
    for panel in panels[index + 1 :]:
        if panel["type"] == "row":
            break
        following.append(panel)
    return following


def test_dashboard_has_the_connection_pool_row() -> None:
    """Issue 12: per host, active, idle and waiting against the limit (dashed); the lifetime of
    connections; the time spent in the queue."""
    dashboard = json.loads(DASHBOARD.read_text())
    panels = {panel["title"]: panel for panel in row_panels(dashboard, "Connection pool")}
    assert set(panels) == {
        "Connection pool to $server",
        "Connection lifetime (closed connections)",
        "Queue time (waiting for a connection)",
    }

    pool = panels["Connection pool to $server"]
    assert pool["repeat"] == "server"  # one panel per host
    exprs = {target["refId"]: target["expr"] for target in pool["targets"]}
    wanted = {
        "http_client_open_connections": (
            'http_connection_state="active"',
            'http_connection_state="idle"',
        ),
        "llm_latency_pool_waiting": ("",),
        "llm_latency_pool_limit": ("",),
        "http_client_active_requests": ("",),
    }
    for metric, matchers in wanted.items():
        for matcher in matchers:
            assert [e for e in exprs.values() if f"{metric}{{" in e and matcher in e], metric
    (limit,) = [ref for ref, expr in exprs.items() if "llm_latency_pool_limit" in expr]
    (override,) = [o for o in pool["fieldConfig"]["overrides"] if o["matcher"]["options"] == limit]
    properties = {p["id"]: p["value"] for p in override["properties"]}
    assert properties["custom.lineStyle"]["fill"] == "dash"
    assert pool["fieldConfig"]["defaults"]["unit"] == "short"

    for title, metric in (
        ("Connection lifetime (closed connections)", "http_client_connection_duration_seconds"),
        ("Queue time (waiting for a connection)", "llm_latency_phase_duration_seconds"),
    ):
        panel = panels[title]
        assert panel["fieldConfig"]["defaults"]["unit"] == "s"
        quantiles = [t["expr"] for t in panel["targets"] if "histogram_quantile" in t["expr"]]
        assert [q.split(",")[0] for q in quantiles] == [
            "histogram_quantile(0.5",
            "histogram_quantile(0.95",
        ], title
        assert all(f"{metric}_bucket{{" in q for q in quantiles), title
    queue = panels["Queue time (waiting for a connection)"]
    assert all('llm_latency_phase="queue"' in t["expr"] for t in queue["targets"])


def test_dashboard_has_the_token_row() -> None:
    """The server's share, per model and host: output and input tokens per second (the released
    names' counter, or the old token usage histogram's _sum by token type), the time per output token's p50 and p95 with the
    decode speed 1 / p50 in tokens/s on the right axis, the time to first token's p50 and p95."""
    dashboard = json.loads(DASHBOARD.read_text())
    panels = {
        panel["title"]: panel for panel in row_panels(dashboard, "Tokens: the server's share")
    }
    assert set(panels) == {
        "Output tokens per second by model and host",
        "Input tokens per second by model and host",
        "Time per output token (decode), p50 and p95 by model and host",
        "Time to first token, p50 and p95 by model and host",
    }
    by = "gen_ai_response_model, server_address"
    for kind in ("output", "input"):
        panel = panels[f"{kind.capitalize()} tokens per second by model and host"]
        (target,) = panel["targets"]
        released = f"gen_ai_client_inference_usage_{kind}_tokens_total{{"
        assert target["expr"].startswith(f"sum by ({by}) (rate({released}")
        old, _, _ = target["expr"].partition(" or ")[2].partition("[")
        assert old.startswith(f"sum by ({by}) (rate(gen_ai_client_token_usage_sum{{"), old
        assert f'gen_ai_token_type="{kind}"' in target["expr"]
        assert panel["fieldConfig"]["defaults"]["unit"] == "suffix: tok/s"

    tpot = panels["Time per output token (decode), p50 and p95 by model and host"]
    ttft = panels["Time to first token, p50 and p95 by model and host"]
    for panel, metric in (
        (tpot, "llm_latency_time_per_output_token_seconds"),
        (ttft, "llm_latency_time_to_first_token_seconds"),
    ):
        assert panel["fieldConfig"]["defaults"]["unit"] == "s"
        exprs = {target["refId"]: target["expr"] for target in panel["targets"]}
        for ref, quantile in (("A", "0.5"), ("B", "0.95")):
            assert exprs[ref].startswith(f"histogram_quantile({quantile}, sum by (le, {by}) ("), ref
            assert f"{metric}_bucket{{" in exprs[ref]
        for target in panel["targets"]:
            assert "{{gen_ai_response_model}} {{server_address}}" in target["legendFormat"]
    exprs = {target["refId"]: target["expr"] for target in tpot["targets"]}
    assert exprs["C"] == f"1 / {exprs['A']}"  # decode speed: 1 / p50
    (override,) = tpot["fieldConfig"]["overrides"]
    assert override["matcher"] == {"id": "byFrameRefID", "options": "C"}
    properties = {p["id"]: p["value"] for p in override["properties"]}
    assert properties["unit"] == "suffix: tok/s"
    assert properties["custom.axisPlacement"] == "right"


def test_the_panels_do_not_overlap_and_have_unique_ids() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard_panels(dashboard, rows=True)
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), ids
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, (panel["title"], cells.get((x, y)))
                cells[(x, y)] = panel["title"]


#: The gauges of the connection pool: an instance that stopped keeps its last values in the
#: collector for its metric_expiration (60 minutes).
POOL_GAUGES = (
    "http_client_open_connections",
    "http_client_active_requests",
    "llm_latency_pool_waiting",
    "llm_latency_pool_limit",
)
LIVE_INSTANCES = (
    "and on (job, instance, server_address) "
    'increase(http_client_request_duration_seconds_count{otel_scope_name="llm_latency"'
)


def test_pool_gauges_count_only_instances_that_made_requests() -> None:
    """A program that stopped with requests waiting would show them, and fire the alert, for an
    hour: every query of a pool gauge keeps only the instances that finished an attempt to the
    host lately."""
    queries = [q for q in all_queries() if selected_metrics(q) & set(POOL_GAUGES)]
    assert len(queries) >= 6  # the dashboard's five, the alert
    for query in queries:
        assert LIVE_INSTANCES in " ".join(query.expr.split()), query.where


def test_every_dashboard_panel_links_to_the_traces_behind_it() -> None:
    """Each panel has data links to a Jaeger search (Explore on the Jaeger datasource, or the
    Jaeger UI); histogram panels over time also show exemplars, which open the trace."""
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard_panels(dashboard):
        links = panel["fieldConfig"]["defaults"].get("links", []) + panel.get("links", [])
        to_jaeger = [
            link
            for link in links
            if "localhost:16686" in link["url"]
            or "jaeger" in dashboard_datasource_uids({"url": link["url"]})
        ]
        assert to_jaeger, f"panel {panel['title']!r} links to no traces"
        for target in panel["targets"]:
            if "_bucket" in target["expr"] and not target.get("instant"):
                assert target["exemplar"] is True, (panel["title"], target["refId"])


def test_dashboard_links_name_jaegers_service_also_under_a_namespace() -> None:
    """With service.namespace set, the collector's job label is "namespace/name", while Jaeger
    knows the service as "name": every link to Jaeger uses the service variable, which is the
    job without that prefix."""
    text = DASHBOARD.read_text()
    dashboard = json.loads(text)
    urls = re.findall(r'"url": "([^"]*)"', text)
    to_jaeger = [u for u in urls if "16686" in u or "jaeger" in u]
    assert to_jaeger
    for url in to_jaeger:
        assert "${job}" not in url, url
    assert all("${service}" in u for u in to_jaeger if "service" in u)
    (service,) = [v for v in dashboard["templating"]["list"] if v["name"] == "service"]
    assert 'job=~"$job"' in service["query"]["query"]
    pattern = re.compile(service["regex"].strip("/"))
    for job, name in (("prod/chat-api", "chat-api"), ("chat-api", "chat-api"), ("a/b/c", "c")):
        match = pattern.match(job)
        assert match is not None and match.group(1) == name, job


#: Go's time.ParseDuration syntax, which Jaeger's query service parses minDuration with.
GO_DURATION = re.compile(r"(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))+")


def js_string(number: float) -> str:
    """``String(number)`` in JavaScript (ECMAScript Number::toString), which is how Grafana
    writes ``${__value.raw}`` into a link: the shortest digits that round-trip, in exponent
    form below 1e-6 and from 1e21 on."""
    if number == 0:
        return "0"
    sign = "-" if number < 0 else ""
    _, digit_tuple, exponent = Decimal(repr(abs(number))).normalize().as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple))
    k, n = len(digits), len(digit_tuple) + exponent  # value = 0.digits * 10**n
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * -n + digits
    mantissa = digits[0] + ("." + digits[1:] if k > 1 else "")
    return f"{sign}{mantissa}e{'+' if n > 0 else '-'}{abs(n - 1)}"


def test_js_string_writes_numbers_as_javascript_does() -> None:
    cases = {0.0: "0", 0.25: "0.25", 300.0: "300", 1e-6: "0.000001", 1e-7: "1e-7"}
    cases |= {1.5e-7: "1.5e-7", 1e21: "1e+21", 123456789.5: "123456789.5", 2.5e-3: "0.0025"}
    assert {number: js_string(number) for number in cases} == cases


def prometheus_round(value: float, to_nearest: float) -> float:
    """PromQL's round(value, to_nearest), as Prometheus computes it (funcRound)."""
    inverse = 1.0 / to_nearest
    return math.floor(value * inverse + 0.5) / inverse


def test_dashboard_links_pass_jaeger_a_duration_it_parses() -> None:
    """The links to the traces slower than a clicked quantile pass its value to Jaeger as
    minDuration, ``${__value.raw}s``, which Jaeger parses with Go's time.ParseDuration: "2.5s"
    works, "1e-7s" is refused. Grafana writes the raw value as JavaScript writes a number, in
    exponent form below 1e-6, so each such panel rounds its quantiles to the microsecond in the
    query (round(..., 0.000001)): a value is then 0 or at least 1e-6, written in plain digits.
    (The program's buckets start at 5 ms, so p50 and p95 stay above 2.5 ms; finer buckets, from
    a View of the user's, reach below 1 µs.) The value stays in seconds: the exemplars drawn on
    the same axis are in seconds."""
    import promql_parser

    seconds = (0.0, 1e-7, 4.9e-7, 5e-7, 1.2e-6, 3.3e-5, 0.0025, 0.25, 2.5, 300.0, 86400.5)
    linked = 0
    for panel in dashboard_panels(json.loads(DASHBOARD.read_text())):
        links = panel["fieldConfig"]["defaults"].get("links", [])
        queries = [urllib.parse.unquote(link["url"]) for link in links]
        if not any("minDuration" in query for query in queries):
            continue
        linked += 1
        assert panel["fieldConfig"]["defaults"]["unit"] == "s", panel["title"]
        for query in queries:
            assert '"minDuration":"${__value.raw}s"' in query, (panel["title"], query)
        for target in panel["targets"]:
            expr = promql_parser.parse(substitute(target["expr"]))
            step = None  # round(..., step): the value is rounded to a multiple of step
            if isinstance(expr, promql_parser.Call) and expr.func.name == "round":
                assert isinstance(expr.args[1], promql_parser.NumberLiteral)
                step = expr.args[1].val
            for quantile in seconds:
                value = quantile if step is None else prometheus_round(quantile, step)
                written = js_string(value) + "s"
                assert GO_DURATION.fullmatch(written), (panel["title"], quantile, written)
                assert abs(value - quantile) <= (step or 0) / 2, written
    assert linked == 4  # phases p50 and p95, time to first chunk, request duration p95


# -- the collector: components, span metrics, exporter ----------------------------------------

KINDS = ("receivers", "processors", "exporters", "connectors", "extensions")

#: Component types of collector 0.159 whose module is named otherwise than the type without
#: underscores (otlp_grpc and otlp_http were renamed in 0.144; the old names are aliases).
MODULE_OF_TYPE = {"otlp_grpc": "otlp", "otlp_http": "otlphttp"}


def manifest_components() -> dict[str, set[str]]:
    """kind -> module names without their kind suffix, e.g. exporters: {"otlp", "prometheus"}."""
    manifest = load_yaml(reference(MANIFEST))
    components: dict[str, set[str]] = {}
    for kind in KINDS:
        suffix = kind[:-1]
        components[kind] = {
            entry["gomod"].split()[0].rsplit("/", 1)[1].removesuffix(suffix)
            for entry in manifest[kind]
        }
    return components


def collector_configs() -> dict[str, dict[str, Any]]:
    return {
        "compose": load_yaml(COLLECTOR_CONFIG),
        "helm agent": load_yaml(HELM_AGENT)["config"],
        "helm gateway": load_yaml(HELM_GATEWAY)["config"],
    }


def defined(config: dict[str, Any], kind: str, helm: bool) -> set[str]:
    """The components a config defines. In Helm values, null deletes a chart default (the
    chart's jaeger, zipkin and prometheus receivers); in a collector config it is an empty
    configuration."""
    components = config.get(kind) or {}
    return {name for name, settings in components.items() if settings is not None or not helm}


def check_components(config: dict[str, Any], where: str) -> None:
    helm = where.startswith("helm")  # a collector chart values file
    pipelines = {
        name: pipeline
        for name, pipeline in config["service"]["pipelines"].items()
        if pipeline is not None
    }
    used: dict[str, set[str]] = {kind: set() for kind in KINDS}
    for name, pipeline in pipelines.items():
        assert pipeline["receivers"] and pipeline["exporters"], f"{where}: {name}"
        for kind in ("receivers", "processors", "exporters"):
            used[kind] |= set(pipeline.get(kind, []))
    connectors = defined(config, "connectors", helm)
    for connector in connectors:
        assert connector in used["exporters"], f"{where}: connector {connector} not fed"
        assert connector in used["receivers"], f"{where}: connector {connector} not read"
    used["connectors"] = connectors
    used["receivers"] -= connectors
    used["exporters"] -= connectors
    used["extensions"] = set(config["service"].get("extensions", []))
    for kind in KINDS:
        assert defined(config, kind, helm) == used[kind], f"{where}: {kind} defined != used"


@pytest.mark.parametrize("where", ["compose", "helm agent", "helm gateway"])
def test_collector_components_are_defined_used_and_in_the_distribution(where: str) -> None:
    config = collector_configs()[where]
    check_components(config, where)
    available = manifest_components()
    for kind in KINDS:
        for name in defined(config, kind, helm=where.startswith("helm")):
            component_type = name.split("/")[0]
            module = MODULE_OF_TYPE.get(component_type, component_type.replace("_", ""))
            assert module in available[kind], f"{where}: {kind} {name} not in otelcol-contrib"


def test_jaeger_configs_define_what_they_use() -> None:
    for where, config in (
        ("compose", load_yaml(JAEGER_CONFIG)),
        ("compose memory", load_yaml(JAEGER_MEMORY_CONFIG)),
        ("helm", load_yaml(HELM_JAEGER)["userconfig"]),
    ):
        check_components(config, f"jaeger {where}")


def seconds(duration: str) -> float:
    match = re.fullmatch(r"([\d.]+)(ms|s)", duration)
    assert match, duration
    return float(match.group(1)) / (1000 if match.group(2) == "ms" else 1)


def test_span_metrics_are_in_milliseconds_with_llm_buckets_and_feed_jaeger_monitor() -> None:
    """Jaeger's Monitor tab passes the latency through and its UI reads it as milliseconds: the
    connector's histogram, and Jaeger's latency_unit, are in ms (in seconds the UI shows
    latencies 1000x too small), in compose and in Helm alike. The buckets are the program's
    (5 ms to 300 s), written in ms."""
    configs = collector_configs()
    for where in ("compose", "helm agent"):
        connector = configs[where]["connectors"]["span_metrics"]
        histogram = connector["histogram"]
        assert histogram["unit"] == "ms", where
        written = histogram["explicit"]["buckets"]
        assert all(str(b).endswith("ms") for b in written), (where, written)
        buckets = tuple(seconds(b) for b in written)
        assert buckets == DURATION_BUCKETS, where
        assert connector["exemplars"]["enabled"] is True
        for jaeger in (load_yaml(JAEGER_CONFIG), load_yaml(HELM_JAEGER)["userconfig"]):
            backends = jaeger["extensions"]["jaeger_storage"]["metric_backends"]
            (spm,) = (backend["prometheus"] for backend in backends.values())
            assert spm["metric_namespace"] == connector["namespace"].replace(".", "_")
            assert spm["latency_unit"] == histogram["unit"]
            assert spm["normalize_calls"] and spm["normalize_duration"]
            storage = jaeger["extensions"]["jaeger_query"]["storage"]
            assert storage["metrics"] in backends
    # Nothing queries the span-metrics histogram under its name in seconds.
    assert not [q.where for q in all_queries() if "traces_span_metrics_duration_seconds" in q.expr]
    # Span metrics are computed before sampling: in the agent, never in the sampling gateway.
    assert "span_metrics" not in (configs["helm gateway"].get("connectors") or {})


def test_prometheus_exporters_expose_the_contract_names_with_exemplars() -> None:
    configs = collector_configs()
    for where in ("compose", "helm agent"):
        exporter = configs[where]["exporters"]["prometheus"]
        assert exporter["enable_open_metrics"] is True, where
        assert exporter["translation_strategy"] == "UnderscoreEscapingWithSuffixes", where
    scrape = load_yaml(PROMETHEUS_CONFIG)["scrape_configs"]
    (collector,) = [job for job in scrape if job["job_name"] == "otel-collector"]
    assert collector["honor_labels"] is True
    assert collector["static_configs"] == [{"targets": ["otel-collector:8889"]}]
    prometheus = load_yaml(COMPOSE_FILE)["services"]["prometheus"]
    assert "--enable-feature=exemplar-storage" in prometheus["command"]


def test_prometheus_ingests_created_timestamps_which_come_in_the_protobuf_format() -> None:
    """Prometheus starts a series at its first scraped value, so rate() and increase() never
    count a counter's or histogram's first value (issue 12: a program's first 429, a whole short
    run). The bundle's Prometheus stores a 0 at the created timestamp of each, which the
    collector's exporter sends in the Prometheus protobuf format only (no OpenMetrics _created
    lines): the feature flag makes PrometheusProto the first scrape protocol, and a
    scrape_protocols setting, global or on the collector's job, must keep it first.
    tests/test_deploy_created_timestamps.py shows the effect with a real Prometheus 3."""
    command = load_yaml(COMPOSE_FILE)["services"]["prometheus"]["command"]
    features = {
        feature
        for argument in command
        if argument.startswith("--enable-feature=")
        for feature in argument.split("=", 1)[1].split(",")
    }
    assert {"exemplar-storage", "created-timestamp-zero-ingestion"} <= features, command
    config = load_yaml(PROMETHEUS_CONFIG)
    (collector,) = [job for job in config["scrape_configs"] if job["job_name"] == "otel-collector"]
    for settings in (config["global"], collector):
        protocols = settings.get("scrape_protocols")
        assert protocols is None or protocols[0] == "PrometheusProto", protocols


def test_collector_sends_traces_to_jaeger_over_otlp() -> None:
    compose = load_yaml(COLLECTOR_CONFIG)
    assert compose["exporters"]["otlp_grpc/jaeger"]["endpoint"] == "jaeger:4317"
    # every address in the compose network (0.0.0.0) unless the environment names one: make e2e
    # runs each service on a loopback address of its own
    assert load_yaml(JAEGER_CONFIG)["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] == (
        "${env:JAEGER_LISTEN_HOST:-0.0.0.0}:4317"
    )
    receivers = compose["receivers"]["otlp"]["protocols"]
    assert receivers["grpc"]["endpoint"] == "${env:OTELCOL_LISTEN_HOST:-0.0.0.0}:4317"
    assert receivers["http"]["endpoint"] == "${env:OTELCOL_LISTEN_HOST:-0.0.0.0}:4318"
    assert compose["service"]["pipelines"]["traces"]["processors"][0].startswith("memory_limiter")


@pytest.mark.parametrize("where", ["compose", "helm agent"])
def test_traces_and_metrics_have_their_own_memory_limiters(where: str) -> None:
    """Each limiter measures the whole process, so with one shared limiter a burst of traces
    gets the program's metrics refused too. The traces pipeline's limiter refuses first (lower
    limit): metrics keep flowing while traces are shed."""
    config = collector_configs()[where]
    pipelines = config["service"]["pipelines"]
    traces = pipelines["traces"]["processors"][0]
    metrics = pipelines["metrics"]["processors"][0]
    assert traces.startswith("memory_limiter/") and metrics.startswith("memory_limiter/")
    assert traces != metrics
    limits = {name: config["processors"][name] for name in (traces, metrics)}
    key = "limit_mib" if "limit_mib" in limits[traces] else "limit_percentage"
    assert limits[traces][key] < limits[metrics][key], limits


# -- Helm ------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [HELM_AGENT, HELM_GATEWAY], ids=lambda p: p.name)
def test_collector_chart_values_validate_against_the_chart_schema(values: Path) -> None:
    import jsonschema

    schema = json.loads(reference(COLLECTOR_CHART_SCHEMA).read_text())
    validator_class = jsonschema.validators.validator_for(
        schema, default=jsonschema.Draft202012Validator
    )
    validator_class.check_schema(schema)
    errors = sorted(validator_class(schema).iter_errors(load_yaml(values)), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


@pytest.mark.parametrize("values", [HELM_AGENT, HELM_GATEWAY], ids=lambda p: p.name)
def test_collector_pod_monitors_carry_the_release_label_kube_prometheus_stack_selects(
    values: Path,
) -> None:
    """kube-prometheus-stack's Prometheus selects PodMonitors by the label ``release`` (its
    Helm release name) by default: without it, nothing is scraped. The chart adds it through
    ``podMonitor.extraLabels``; the chart schema does not forbid unknown podMonitor keys, so the
    keys are checked against its properties here."""
    schema = json.loads(reference(COLLECTOR_CHART_SCHEMA).read_text())
    known = set(schema["properties"]["podMonitor"]["properties"])
    monitor = load_yaml(values)["podMonitor"]
    assert monitor["enabled"] is True
    assert set(monitor) <= known, set(monitor) - known
    assert "extraLabels" in known
    release = monitor["extraLabels"].get("release")
    assert isinstance(release, str) and release, monitor


def test_agent_routes_traces_by_trace_id_to_the_sampling_gateway() -> None:
    agent, gateway = load_yaml(HELM_AGENT), load_yaml(HELM_GATEWAY)
    assert agent["mode"] == "daemonset" and gateway["mode"] == "deployment"
    for values in (agent, gateway):
        assert values["image"] == {
            "repository": "otel/opentelemetry-collector-contrib",
            "tag": "0.159.0",
        }
    exporter = agent["config"]["exporters"]["load_balancing"]
    assert exporter["routing_key"] == "traceID"
    resolver = exporter["resolver"]["dns"]
    assert resolver["hostname"].startswith(gateway["fullnameOverride"] + ".")
    assert "port" not in resolver  # the resolver's default, 4317, the gateway's OTLP gRPC port
    assert gateway["ports"]["otlp"]["containerPort"] == 4317
    assert gateway["service"]["clusterIP"] == "None"  # headless: one address per pod
    traces = agent["config"]["service"]["pipelines"]["traces"]
    assert traces["exporters"] == ["span_metrics", "load_balancing"]
    assert "tail_sampling" not in agent["config"]["processors"]


def test_gateway_keeps_every_error_and_slow_trace() -> None:
    gateway = load_yaml(HELM_GATEWAY)["config"]
    sampling = gateway["processors"]["tail_sampling"]
    policies = {policy["type"]: policy for policy in sampling["policies"]}
    assert policies["status_code"]["status_code"]["status_codes"] == ["ERROR"]
    assert policies["latency"]["latency"]["threshold_ms"] > 0
    processors = gateway["service"]["pipelines"]["traces"]["processors"]
    assert processors.index("memory_limiter") < processors.index("tail_sampling")
    assert processors.index("tail_sampling") < processors.index("batch")


#: What a trace's spans may be spread over, in seconds: llm-latency hands over an attempt's spans
#: when the attempt ends, so the next attempt of a retried call arrives after the backoff
#: (llm_latency.retry: at most 30 s) plus the whole next attempt (a long stream: 120 s), plus
#: the export delays (the SDK's batch span processor, 5 s; the agent's batch and load balancing).
TRACE_SPREAD_SECONDS = 30 + 120 + 10


def test_gateway_waits_for_the_spans_of_retried_calls_and_long_streams() -> None:
    """A trace decided before its last attempt's spans arrive is decided on part of the trace
    (the later spans only follow the cached decision): decision_wait covers a backoff and a
    long stream, and num_traces holds decision_wait's worth of new traces."""
    sampling = load_yaml(HELM_GATEWAY)["config"]["processors"]["tail_sampling"]
    wait = seconds(sampling["decision_wait"])
    assert wait >= TRACE_SPREAD_SECONDS, sampling["decision_wait"]
    assert sampling["num_traces"] >= sampling["expected_new_traces_per_sec"] * wait
    readme = " ".join(README.read_text().split())  # the sizing note states it
    assert f"`decision_wait` ({sampling['decision_wait']})" in readme


def unknown_keys(values: Any, known: Any, path: str = "") -> list[str]:
    """Keys of ``values`` that the chart's values.yaml does not have. Below a key whose default
    is null, an empty map or a list (userconfig, extraEnv, podLabels, ...), anything goes."""
    if not isinstance(values, dict):
        return []
    if not isinstance(known, dict) or not known:
        return [] if known is None or known == {} else [f"{path} (not a map in the chart)"]
    unknown = []
    for key, value in values.items():
        if key not in known:
            unknown.append(f"{path}.{key}")
        else:
            unknown += unknown_keys(value, known[key], f"{path}.{key}")
    return unknown


def test_jaeger_chart_values_use_only_keys_of_the_chart() -> None:
    chart = load_yaml(reference(JAEGER_CHART_VALUES))
    values = load_yaml(HELM_JAEGER)
    # jaeger.resources: documented in the chart's values only as a comment under jaeger:, read
    # by its Deployment template (.Values.jaeger.resources).
    chart["jaeger"]["resources"] = {}
    assert unknown_keys(values, chart) == []
    # The image tag goes where the Jaeger Deployment reads it, not the top-level `tag`.
    assert "tag" not in values
    assert values["jaeger"]["image"]["tag"] == "2.12.0"
    requests = values["jaeger"]["resources"]["requests"]
    assert requests["cpu"] and requests["memory"]
    backends = values["userconfig"]["extensions"]["jaeger_storage"]["backends"]
    assert {kind for backend in backends.values() for kind in backend} <= {
        "elasticsearch",
        "opensearch",
    }


def env_by_name(env: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {variable["name"]: variable for variable in env}


def test_jaeger_stores_in_opensearch_and_the_index_cleaner_cleans_what_it_writes() -> None:
    """Jaeger writes <index_prefix>-jaeger-span-*; the chart's index cleaner (a CronJob) gets
    the URL from storage.elasticsearch.url and everything else from esIndexCleaner.extraEnv: it
    must get the same prefix (INDEX_PREFIX) and the same credentials (ES_USERNAME, ES_PASSWORD
    from the same Secret keys as Jaeger), or it deletes nothing and the store fills up."""
    values = load_yaml(HELM_JAEGER)
    backends = values["userconfig"]["extensions"]["jaeger_storage"]["backends"]
    storage_name = values["userconfig"]["exporters"]["jaeger_storage_exporter"]["trace_storage"]
    (kind,) = backends[storage_name]
    assert kind == "opensearch"  # Jaeger's own OpenSearch backend; Elasticsearch: README
    storage = backends[storage_name][kind]
    prefix = storage["indices"]["index_prefix"]
    assert prefix

    assert values["esIndexCleaner"]["enabled"] is True
    assert values["storage"]["elasticsearch"]["url"] in storage["server_urls"]
    cleaner = env_by_name(values["esIndexCleaner"]["extraEnv"])
    assert cleaner["INDEX_PREFIX"]["value"] == prefix

    jaeger = env_by_name(values["jaeger"]["extraEnv"])
    basic = storage["auth"]["basic"]
    for field, cleaner_variable in (("username", "ES_USERNAME"), ("password", "ES_PASSWORD")):
        match = re.fullmatch(r"\$\{env:(\w+)\}", basic[field])
        assert match, basic[field]
        secret = jaeger[match.group(1)]["valueFrom"]["secretKeyRef"]
        assert cleaner[cleaner_variable]["valueFrom"]["secretKeyRef"] == secret, field


# -- yamllint and the README -----------------------------------------------------------------


def test_yamllint_passes_on_deploy() -> None:
    run("yamllint", "--strict", "-c", str(DEPLOY / ".yamllint"), str(DEPLOY))


def test_readme_gives_the_commands_urls_panels_and_alerts() -> None:
    readme = README.read_text()
    for text in (
        "docker compose -f deploy/compose/docker-compose.yaml up -d",
        "OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318",
        "http://localhost:3000",
        "http://localhost:16686",
        "http://localhost:9090",
        "http://localhost:9093",
        "helm install",
        "--version 0.170.0",
        "--version 4.11.1",
    ):
        assert text in readme, text
    for panel in dashboard_panels(json.loads(DASHBOARD.read_text()), rows=True):
        assert panel["title"] in readme, panel["title"]


# -- one source of versions: compose's image tags ---------------------------------------------

BUILDER_MANIFEST = DEPLOY / "build" / "otelcol-builder.yaml"
BUILD_SCRIPT = DEPLOY / "build" / "build-bundle"


def compose_tag(image: str) -> str:
    services = load_yaml(COMPOSE_FILE)["services"]
    (tag,) = [
        s["image"].rpartition(":")[2]
        for s in services.values()
        if s["image"].startswith(f"{image}:")
    ]
    return str(tag)


def test_helm_and_the_reference_manifest_run_the_versions_compose_pins() -> None:
    collector = compose_tag("otel/opentelemetry-collector-contrib")
    for values in (HELM_AGENT, HELM_GATEWAY):
        image = load_yaml(values)["image"]
        assert (image["repository"], image["tag"]) == (
            "otel/opentelemetry-collector-contrib",
            collector,
        )
    assert load_yaml(reference(MANIFEST))["dist"]["version"] == collector
    assert load_yaml(HELM_JAEGER)["jaeger"]["image"]["tag"] == compose_tag("jaegertracing/jaeger")


def test_the_build_takes_every_version_from_compose() -> None:
    """deploy/build/build-bundle reads each service's version from its compose image tag, and
    the builder manifest names no version of its own."""
    script = BUILD_SCRIPT.read_text()
    for image in ("otel/opentelemetry-collector-contrib", "jaegertracing/jaeger", "prom/prometheus",
                  "prom/alertmanager"):  # fmt: skip
        assert f"$(tag {image})" in script
    manifest = load_yaml(BUILDER_MANIFEST)
    assert manifest["dist"]["version"] == "VERSION"
    modules = [entry["gomod"] for kind in (*KINDS, "providers") for entry in manifest.get(kind, [])]
    assert all(module.split()[1] in ("vVERSION", "vPROVIDERS_VERSION") for module in modules)


def test_the_built_collector_has_exactly_the_components_the_configs_use() -> None:
    """What compose's config and the Helm tiers' rendered configs define (the chart's default
    config and presets included: its debug exporter, the agent's k8s_attributes)."""
    manifest = load_yaml(BUILDER_MANIFEST)
    configs = {
        "compose": load_yaml(COLLECTOR_CONFIG),
        "helm agent": rendered_config(load_yaml(HELM_AGENT)),
        "helm gateway": rendered_config(load_yaml(HELM_GATEWAY)),
    }
    for kind in KINDS:
        suffix = kind[:-1]
        built = {entry["gomod"].split()[0].rsplit("/", 1)[1].removesuffix(suffix)
                 for entry in manifest.get(kind, [])}  # fmt: skip
        used = {
            MODULE_OF_TYPE.get(name.split("/")[0], name.split("/")[0].replace("_", ""))
            for config in configs.values()
            for name in defined(config, kind, helm=False)
        }
        assert built == used, kind
