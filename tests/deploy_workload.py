"""Helpers for the deploy/ tests (tests/test_deploy_*.py).

1. An instrumented program, run as ``python -m tests.deploy_workload`` from the repository root:
   it serves the metrics llm-latency records in the Prometheus format on 127.0.0.1 and calls a
   loopback LLM server in rounds, for a bounded time. Each round gives every series that the
   dashboard and the alert rules query:

   - a streamed (SSE) request over TLS to a host name, ``llm.test``, that a loopback DNS server
     resolves: a new connection, so the dns, connect, tls, send, wait and receive phases, the
     time to first chunk, and the server processing time (``openai-processing-ms``);
   - two concurrent requests through a pool of one connection: the queue phase and pooled
     connections;
   - a 429, and a call through ``llm_latency.retry`` whose first attempt gets a 429: a retry;
   - rate-limit headers (tests.servers sends ``x-ratelimit-remaining-*`` on every response);
   - a streamed chat completion with ``stream_options.include_usage`` to the product's mock
     server (``llm_latency.testing``), at ``llm.test`` too, which ends its stream with OpenAI's
     usage chunk: the token usage (input and output), the time per output token and the time
     to first token, by model (:data:`WORKLOAD_MODEL`) and host.

   The names are those the OpenTelemetry Collector's prometheus exporter produces
   (``translation_strategy: UnderscoreEscapingWithSuffixes``): opentelemetry-exporter-prometheus
   0.66b1 produces the same ones (dots to underscores, unit suffix, ``_total`` on counters,
   booleans as ``true``/``false``); tests/test_deploy_prometheus.py checks them against
   DESIGN.md, so the queries are tested against the names a deployment really has.

2. What the bundle queries: every PromQL expression of the Grafana dashboard, the Grafana
   datasources (trace-to-metrics links) and the alert rules, with Grafana's variables replaced.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import ssl
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose"
COMPOSE_FILE = COMPOSE / "docker-compose.yaml"
COLLECTOR_CONFIG = COMPOSE / "otel-collector.yaml"
JAEGER_CONFIG = COMPOSE / "jaeger" / "config.yaml"
PROMETHEUS_CONFIG = COMPOSE / "prometheus" / "prometheus.yaml"
RULES_FILE = COMPOSE / "prometheus" / "rules" / "llm-latency.rules.yaml"
RULES_TEST_FILE = COMPOSE / "prometheus" / "tests" / "llm-latency.rules.test.yaml"
ALERTMANAGER_CONFIG = COMPOSE / "alertmanager" / "alertmanager.yaml"
DATASOURCES = COMPOSE / "grafana" / "provisioning" / "datasources" / "datasources.yaml"
DASHBOARD_PROVIDERS = COMPOSE / "grafana" / "provisioning" / "dashboards" / "dashboards.yaml"
DASHBOARD = COMPOSE / "grafana" / "dashboards" / "llm-latency.json"
HELM = DEPLOY / "helm"
HELM_AGENT = HELM / "otel-collector-agent.values.yaml"
HELM_GATEWAY = HELM / "otel-collector-gateway.values.yaml"
HELM_JAEGER = HELM / "jaeger.values.yaml"
README = DEPLOY / "README.md"

#: The host name the workload calls; it is the server_address of every series it produces.
WORKLOAD_HOST = "llm.test"
#: The model of its streamed answers with usage: the gen_ai_response_model of the token series.
WORKLOAD_MODEL = "test-model"
#: The mock server's pace: a first token after 20 ms, then 8 tokens at 400 per second.
WORKLOAD_TOKENS = 8
WORKLOAD_TOKENS_PER_SECOND = 400.0


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


INSTALL_HINTS = {
    "docker-compose": "apt-get install -y docker-compose",
    "promtool": "apt-get install -y prometheus",
    "prometheus": "apt-get install -y prometheus",
    "amtool": "apt-get install -y prometheus-alertmanager",
    "check-jsonschema": "pip install check-jsonschema",
    "yamllint": "pip install yamllint",
}


def tool(name: str) -> str:
    """The path of a command-line tool: the virtual environment's, else on PATH. A missing tool
    fails the test (it is not skipped): CI installs them all."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed; CI installs it: {INSTALL_HINTS[name]}")
    return found


# -- what the bundle queries -------------------------------------------------------------------

#: Grafana's variables, as Grafana would replace them: $job and $server by "All" (a regex
#: matching everything; the dashboard only uses them in =~ matchers), the intervals by durations
#: that fit a short test run, $__tags (trace-to-metrics links) by the labels of a span to the
#: workload's host.
GRAFANA_VARIABLES = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "5m",
    "job": ".*",
    "server": ".*",
    "__tags": f'server_address="{WORKLOAD_HOST}"',
}


def substitute(expr: str, variables: Mapping[str, str] = GRAFANA_VARIABLES) -> str:
    """``expr`` with Grafana's ``$name`` and ``${name}`` variables replaced."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise KeyError(f"unknown Grafana variable ${name} in {expr!r}")
        return variables[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", value, expr)


@dataclass(frozen=True)
class Query:
    """A PromQL expression of the bundle and where it comes from."""

    where: str
    expr: str  # as written (Grafana variables included)
    alert: bool = False  # an alerting rule's expression: a threshold, silent when all is well

    @property
    def promql(self) -> str:
        return substitute(self.expr)


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def dashboard_panels(dashboard: dict[str, Any], rows: bool = False) -> list[dict[str, Any]]:
    """The dashboard's panels, those inside a collapsed row included; the rows themselves (which
    only group panels: no query, no link) only with ``rows``."""
    panels = []
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            panels.append(panel)
            continue
        if rows:
            panels.append(panel)
        panels += panel.get("panels", [])
    return panels


def dashboard_queries() -> list[Query]:
    """The panels' PromQL targets, and the metric selectors of the label_values() variables."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = []
    for panel in dashboard_panels(dashboard):
        for target in panel.get("targets", []):
            where = f"dashboard panel {panel['title']!r} target {target['refId']}"
            queries.append(Query(where, target["expr"]))
    for variable in dashboard["templating"]["list"]:
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["definition"])
        assert match, f"dashboard variable {variable['name']}: not label_values(selector, label)"
        queries.append(Query(f"dashboard variable {variable['name']}", match.group(1)))
    return queries


def datasource_queries() -> list[Query]:
    """The trace-to-metrics queries of the Jaeger datasource."""
    queries = []
    for source in load_yaml(DATASOURCES)["datasources"]:
        links = source.get("jsonData", {}).get("tracesToMetrics", {})
        for query in links.get("queries", []):
            queries.append(Query(f"datasource {source['name']} {query['name']!r}", query["query"]))
    return queries


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(RULES_FILE)["groups"] for rule in group["rules"]]


def rule_queries() -> list[Query]:
    return [Query(f"alert {rule['alert']}", rule["expr"], alert=True) for rule in alert_rules()]


def all_queries() -> list[Query]:
    return dashboard_queries() + datasource_queries() + rule_queries()


COMPARISONS = {">", "<", ">=", "<=", "==", "!="}


def data_checks(expr: Any) -> list[Any]:
    """The parts of a parsed alert expression that must return data while all is well.

    An alert is a threshold: its whole expression is empty when nothing is wrong, so it cannot
    show that its metrics exist. This takes it apart (promql_parser AST): a comparison with a
    number keeps its other side (the value without its threshold); ``a and b`` and ``a or b``
    keep both sides (each branch, and each condition, must see its series); ``a unless b`` keeps
    ``a``; ``absent(x)`` keeps ``x`` (the series whose absence it detects); anything else is
    kept whole.
    """
    import promql_parser

    if isinstance(expr, promql_parser.ParenExpr):
        return data_checks(expr.expr)
    if isinstance(expr, promql_parser.BinaryExpr):
        op = str(expr.op)
        return_bool = expr.modifier is not None and expr.modifier.return_bool
        if op in COMPARISONS and not return_bool:
            if isinstance(expr.rhs, promql_parser.NumberLiteral):
                return data_checks(expr.lhs)
            if isinstance(expr.lhs, promql_parser.NumberLiteral):
                return data_checks(expr.rhs)
            return [*data_checks(expr.lhs), *data_checks(expr.rhs)]
        if op in ("and", "or"):
            return [*data_checks(expr.lhs), *data_checks(expr.rhs)]
        if op == "unless":
            return data_checks(expr.lhs)
        return [expr]
    if isinstance(expr, promql_parser.Call) and expr.func.name in ("absent", "absent_over_time"):
        return data_checks(expr.args[0])
    return [expr]


# -- the instrumented program -------------------------------------------------------------------


async def _post(session: Any, url: str) -> int:
    async with session.post(url, json={"model": "test-model", "messages": []}) as response:
        await response.read()
        return int(response.status)


async def _stream_with_usage(session: Any, url: str) -> None:
    """A streamed chat completion that asks for its usage (OpenAI's ``include_usage``)."""
    body = {
        "model": WORKLOAD_MODEL,
        "messages": [{"role": "user", "content": "count to eight"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with session.post(url, json=body) as response:
        await response.read()
        assert response.status == 200, response.status


async def _round(
    number: int,
    server: Any,
    mock: Any,
    nameserver: str,
    client_ssl: ssl.SSLContext,
    waits: Path | None,
) -> None:
    """One round (the module's docstring); with ``waits``, a line appended to that file per
    streamed answer with usage: what the machine took from this process while it ran (s: its
    threads' run-queue waits and the garbage collector's pauses), which a loaded machine adds to
    the time per output token (tests/test_deploy_prometheus.py takes it out)."""
    import aiohttp

    import llm_latency
    from tests.cpu_waits import collector_pauses, machine_waits

    resolver = aiohttp.AsyncResolver(nameservers=[nameserver])
    connector = aiohttp.TCPConnector(limit=1, resolver=resolver, ssl=client_ssl)
    async with aiohttp.ClientSession(connector=connector) as session:
        # a new connection (dns, connect, tls), streamed: time to first chunk
        await _post(session, server.url(host=WORKLOAD_HOST, wait=0.05, chunks=4, gap=0.01, sse=1))
        # two at once through one connection: one waits in the queue, both reuse it
        url = server.url(host=WORKLOAD_HOST, wait=0.02)
        await asyncio.gather(_post(session, url), _post(session, url))
        # a 429
        await _post(session, server.url(host=WORKLOAD_HOST, status=429))

        # a 429, retried once
        @llm_latency.retry(attempts=3, base_delay=0.01, max_delay=0.05)
        async def retried() -> None:
            url = server.url(host=WORKLOAD_HOST, scenario=f"round-{number}", fail=1, retry_ms=10)
            async with session.post(url, json={}, raise_for_status=True) as response:
                await response.read()

        await retried()
        # a streamed answer with usage: tokens, time per output token, time to first token
        with machine_waits(os.getpid()) as waited, collector_pauses() as collected:
            await _stream_with_usage(session, mock.url(host=WORKLOAD_HOST))
        if waits is not None:
            with waits.open("a", encoding="ascii") as file:
                file.write(f"{waited.peers + collected.seconds:.6f}\n")


async def _run(seconds: float, pause: float, waits: Path | None) -> int:
    import trustme

    from llm_latency.testing import Profile, running
    from tests.servers import llm_server, slow_dns

    ca = trustme.CA()
    server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(WORKLOAD_HOST).configure_cert(server_ssl)
    client_ssl = ssl.create_default_context()
    ca.configure_trust(client_ssl)
    dns = slow_dns()  # A 127.0.0.1 for names under .test
    profile = Profile(
        ttfb=0.02, tokens=WORKLOAD_TOKENS, tokens_per_second=WORKLOAD_TOKENS_PER_SECOND
    )
    rounds = 0
    try:
        async with llm_server(ssl_context=server_ssl) as server, running(profile) as mock:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                await _round(rounds, server, mock, dns.nameserver, client_ssl, waits)
                rounds += 1
                await asyncio.sleep(pause)
    finally:
        dns.stop()
    return rounds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="metrics port on 127.0.0.1 (0: any)")
    parser.add_argument("--seconds", type=float, default=120.0, help="stop after this long")
    parser.add_argument("--pause", type=float, default=0.2, help="seconds between rounds")
    parser.add_argument(
        "--waits", type=Path, help="append what the machine took from each streamed answer here"
    )
    args = parser.parse_args(argv)

    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from prometheus_client import start_http_server

    import llm_latency

    resource = Resource.create({"service.name": "deploy-workload"})
    meter_provider = MeterProvider(metric_readers=[PrometheusMetricReader()], resource=resource)
    tracer_provider = TracerProvider(resource=resource)
    llm_latency.instrument(
        tracer_provider=tracer_provider, meter_provider=meter_provider, configure=False
    )
    httpd, _ = start_http_server(args.port, addr="127.0.0.1")
    print(f"metrics http://127.0.0.1:{httpd.server_port}/metrics", flush=True)
    try:
        rounds = asyncio.run(_run(args.seconds, args.pause, args.waits))
    finally:
        llm_latency.uninstrument()
        httpd.shutdown()
    print(f"done after {rounds} rounds", flush=True)


if __name__ == "__main__":
    main()
