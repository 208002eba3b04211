"""The first value of every counter and histogram reaches rate() and increase() (issue 12).

Prometheus starts a series at its first scraped value, so without more a counter's first
increase, such as a process's first 429, is never counted, and a short run (``llm-latency
demo``) shows flat zeros on the rate panels and nothing on the quantile panels. The bundle's
Prometheus is started with ``--enable-feature=created-timestamp-zero-ingestion``: it then asks
for the Prometheus protobuf format first, in which the collector's prometheus exporter gives
each counter and histogram its created timestamp (the OTLP start time), and Prometheus stores a
0 at that instant before the first value.

Here a real Prometheus (Debian unstable's 3.x, or Debian 13's 2.53 when unstable has none,
unpacked by .ci/prometheus3; the compose file pins 3.13) runs with the feature flags of deploy/compose/docker-compose.yaml and the ``otel-collector``
scrape job of deploy/compose/prometheus/prometheus.yaml, scraping every second a stand-in of
the collector's exporter (tests/prometheus_exposition.py) that serves what a program
instrumented by llm-latency recorded. The program makes its first 429 after Prometheus has
already scraped it; the dashboard's 429 panel and its p95 panel must then show it.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.conftest import Telemetry
from tests.deploy_workload import (
    COMPOSE_FILE,
    DASHBOARD,
    PROMETHEUS_CONFIG,
    ROOT,
    dashboard_panels,
    load_yaml,
    substitute,
)
from tests.processes import die_with_parent
from tests.prometheus_exposition import PROTOBUF, CollectorExporter
from tests.servers import LLMServer

#: Where .ci/prometheus3 unpacks Prometheus 3; LLM_LATENCY_PROMETHEUS3 names another binary.
DEFAULT_BINARY = ROOT / ".tools" / "prometheus3" / "usr" / "bin" / "prometheus"

#: created-timestamp-zero-ingestion appeared in Prometheus 2.50.
OLDEST_VERSION = (2, 50)


def prometheus_binary() -> str:
    binary = Path(os.environ.get("LLM_LATENCY_PROMETHEUS3", DEFAULT_BINARY))
    if not binary.exists():
        pytest.fail(f"{binary} is missing: run .ci/prometheus3 (CI does)")
    version = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    match = re.search(r"version (\d+)\.(\d+)", version)
    assert match and tuple(map(int, match.groups())) >= OLDEST_VERSION, version
    return str(binary)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bundle_feature_flags() -> list[str]:
    command = load_yaml(COMPOSE_FILE)["services"]["prometheus"]["command"]
    return [argument for argument in command if argument.startswith("--enable-feature=")]


def bundle_config(target_port: int) -> dict[str, Any]:
    """The bundle's global settings and its ``otel-collector`` job, scraping the stand-in on
    loopback every second."""
    bundle = load_yaml(PROMETHEUS_CONFIG)
    (job,) = [job for job in bundle["scrape_configs"] if job["job_name"] == "otel-collector"]
    job = {**job, "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]}
    interval = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    return {"global": {**bundle["global"], **interval}, "scrape_configs": [job]}


class Prometheus:
    def __init__(self, directory: Path, target_port: int) -> None:
        self.port = free_port()
        config = directory / "prometheus.yaml"
        config.write_text(yaml.safe_dump(bundle_config(target_port)))
        self.log = directory / "prometheus.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [
                    prometheus_binary(),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={directory / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                    *bundle_feature_flags(),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )

    def get(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[Any]:
        return list(self.get("/api/v1/query", query=promql)["result"])

    def stop(self) -> None:
        self.process.kill()  # its storage is the test's temporary directory
        self.process.wait(timeout=10)


async def eventually(condition: Any, what: str, prometheus: Prometheus, timeout: float) -> Any:
    """``condition()``'s first true result, polling every 0.25 s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if prometheus.process.poll() is not None:
            pytest.fail(f"prometheus exited:\n{prometheus.log.read_text()}")
        result = condition()
        if result:
            return result
        await asyncio.sleep(0.25)
    pytest.fail(f"{what} after {timeout} s; prometheus log:\n{prometheus.log.read_text()}")


def dashboard_query(panel_title: str, ref_id: str) -> str:
    panels = dashboard_panels(json.loads(DASHBOARD.read_text()))
    (panel,) = [panel for panel in panels if panel["title"] == panel_title]
    (target,) = [target for target in panel["targets"] if target["refId"] == ref_id]
    return substitute(target["expr"])


@pytest.fixture
async def scraped(
    telemetry: Telemetry, tmp_path: Path
) -> AsyncIterator[tuple[CollectorExporter, Prometheus]]:
    exporter = CollectorExporter(telemetry.reader)
    prometheus = Prometheus(tmp_path, exporter.port)
    try:
        yield exporter, prometheus
    finally:
        prometheus.stop()
        exporter.close()


def samples(prometheus: Prometheus, selector: str) -> list[tuple[float, float]]:
    """(timestamp in s, value) of the single series ``selector`` names, over the last minute."""
    result = prometheus.query(f"{selector}[1m]")
    if len(result) != 1:
        return []
    return [(float(t), float(v)) for t, v in result[0]["values"]]


async def test_the_first_429_of_a_process_shows_on_the_dashboard(
    scraped: tuple[CollectorExporter, Prometheus], server: LLMServer, telemetry: Telemetry
) -> None:
    exporter, prometheus = scraped
    # Prometheus has been scraping the program before its first request.
    exporter.export()
    await eventually(lambda: len(exporter.served) >= 2, "no scrape", prometheus, 30)
    before_first_429 = time.time()
    async with aiohttp.ClientSession() as session:
        for status in (429, 200):
            async with session.post(server.url(status=status), json={}) as response:
                await response.read()
    exporter.export()  # the program's next periodic export
    scrapes_before = len(exporter.served)
    await eventually(
        lambda: len(exporter.served) >= scrapes_before + 3, "no scrape after", prometheus, 30
    )

    # The scrapes were in the protobuf format, the one that carries created timestamps.
    assert set(exporter.served) == {PROTOBUF}, exporter.served

    # The 429 counter has a 0 at its created timestamp (the SDK's start time of the series:
    # the collection that first saw the 429, an instrument observed at export), then counts it.
    (point,) = telemetry.metric_points("llm_latency.rate_limited")
    created = round(point.start_time_unix_nano // 1_000_000 / 1000, 3)
    assert created >= before_first_429 - 0.001
    counted = await eventually(
        lambda: samples(prometheus, "llm_latency_rate_limited_total"),
        "no 429 counter",
        prometheus,
        10,
    )
    assert (created, 0.0) in counted, counted
    after = [value for timestamp, value in counted if timestamp > created]
    assert after and set(after) == {1.0}, counted

    # The dashboard's panels show it: 429s per minute, and the p95 of the two requests.
    per_minute = prometheus.query(dashboard_query("Retries and 429s per minute", "B"))
    assert per_minute and float(per_minute[0]["value"][1]) > 0, per_minute
    p95 = prometheus.query(dashboard_query("Request duration p95 by host", "A"))
    assert p95 and math.isfinite(float(p95[0]["value"][1])), p95

    # The exemplars still reach Prometheus (trace links on the graphs): the protobuf format
    # carries them as OpenMetrics does.
    now = time.time()
    exemplars = prometheus.get(
        "/api/v1/query_exemplars",
        query="http_client_request_duration_seconds_bucket",
        start=str(now - 60),
        end=str(now),
    )
    trace_ids = {e["labels"].get("trace_id") for series in exemplars for e in series["exemplars"]}
    assert {format(s.context.trace_id, "032x") for s in telemetry.requests()} <= trace_ids
