"""examples/locustfile.py, run for real: Locust (from PyPI) on its gevent, against
``llm-latency mock-server`` on loopback, with the SDK set up from ``OTEL_*`` as the locustfile's
docstring says. The spans go over OTLP/HTTP to a receiver in this test; the metrics are served
by the SDK's Prometheus exporter and scraped by a real Prometheus (the Debian package).

Checked: every request Locust counted has its request span with its phases (Locust's final
statistics, ``--json-file``, against the spans, by outcome), nothing is dropped, and the
dashboard's queries return data from that Prometheus, except those whose series this workload
cannot produce (``EXPECTED_EMPTY``).

Also, without Locust: requests under gevent's monkey-patching (tests/programs/gevent_requests.py),
for the two faults the first Locust run showed (first requests racing the SDK's set-up, and
streamed responses abandoned inside a reference cycle).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.command_line import mock_server
from tests.deploy_workload import ROOT, dashboard_queries
from tests.otlp_receiver import OTLPReceiver, Span
from tests.processes import die_with_parent
from tests.test_deploy_prometheus import Prometheus, free_port

# One worker runs this module (Locust, a mock server and a Prometheus at once), as one group.
pytestmark = pytest.mark.xdist_group("locust")

LOCUSTFILE = ROOT / "examples" / "locustfile.py"
GEVENT_PROGRAM = ROOT / "tests" / "programs" / "gevent_requests.py"

#: The load: 50 users, all started in the first second, for 15 s. About 430 requests, a
#: connection per user, and a dozen Prometheus scrapes (two are enough for rate()); 20 s would
#: show nothing more and cost CI 5 s more per dependency set.
USERS = 50
RUN_SECONDS = 15
#: The mock server's answer: 20 tokens, streamed as 20 SSE events and ``data: [DONE]``.
TOKENS = 20
REQUEST = "POST /v1/chat/completions"
PHASES = {"http.send", "http.wait", "http.receive"}
NEW_CONNECTION = {"http.dns", "http.connect"}  # to ``localhost``: a lookup, then a connect

#: The dashboard's queries with no series to show under this workload.
EXPECTED_EMPTY = {
    # Nothing retries: neither Locust nor the locustfile uses llm_latency.retry or urllib3's
    # Retry, so llm_latency_retries_total has no series.
    "dashboard panel 'Retries and 429s per minute' target A",
    # requests' pools do not block (pool_block=False): urllib3 opens a connection whenever none
    # is free, so no request waits in a queue phase and the pools have no limit.
    "dashboard panel 'Queue time (waiting for a connection)' target A",
    "dashboard panel 'Queue time (waiting for a connection)' target B",
    "dashboard panel 'Queue time (waiting for a connection)' target C",
    "dashboard panel 'Connection pool to $server' target E",
    # No connection closes while Prometheus scrapes, so no lifetime is recorded: each user
    # keeps its one (the OTLP exporter's own connections are not the program's: not counted).
    "dashboard panel 'Connection lifetime (closed connections)' target A",
    "dashboard panel 'Connection lifetime (closed connections)' target B",
    # requests under gevent runs on no asyncio loop: no event-loop lag is measured.
    "dashboard panel 'Wait vs server processing vs network overhead (mean)' target D",
    # The Collector's span metrics (send, wait, receive: DESIGN.md, "Metrics"): this Prometheus
    # scrapes the program alone; tests/e2e/test_metrics.py checks them against the Collector.
    "dashboard panel 'Time per phase, p50 (stacked)' target A",
    "dashboard panel 'Time per phase, p95 (stacked)' target A",
    "dashboard panel 'Wait vs server processing vs network overhead (mean)' target A",
    "dashboard panel 'Wait vs server processing vs network overhead (mean)' target C",
    # The findings service's metrics (llm-latency advise, fed by the Collector): this Prometheus
    # scrapes the program alone; tests/e2e/test_advise.py checks them against the bundle.
    "dashboard panel 'Fixes ranked by saving (llm-latency advise)' target A",
    "dashboard panel 'Fixes ranked by saving (llm-latency advise)' target B",
    "dashboard panel 'Fixes ranked by saving (llm-latency advise)' target C",
    "dashboard panel 'Fixes ranked by saving (llm-latency advise)' target D",
    'dashboard panel "Saving of each fix, share of the calls\' time" target A',
}


def clean_environment(**otel: str) -> dict[str, str]:
    """This process's environment without its ``OTEL_*`` variables, plus ``otel``."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environment.update(otel)
    return environment


# -- the spans --------------------------------------------------------------------------------


def phases_of(spans: list[Span]) -> dict[str, set[str]]:
    """Request span id -> the names of its phase spans."""
    phases: dict[str, set[str]] = {}
    for span in spans:
        if span.name.startswith("http.") and span.parent_id is not None:
            phases.setdefault(span.parent_id, set()).add(span.name)
    return phases


def console_spans(output: str) -> list[Span]:
    """The spans the SDK's ConsoleSpanExporter printed (one JSON document each), in ``output``
    where other lines may come between them."""
    decoder = json.JSONDecoder()
    spans, at = [], 0
    while (at := output.find("{", at)) != -1:
        document, at = decoder.raw_decode(output, at)
        spans.append(
            Span(
                name=document["name"],
                span_id=document["context"]["span_id"],
                parent_id=document["parent_id"],
                attributes=document["attributes"],
            )
        )
    return spans


# -- without Locust: requests under gevent ----------------------------------------------------


def test_requests_under_gevent_trace_first_requests_and_abandoned_streams() -> None:
    """Twenty greenlets' first requests, started while the first one sets the SDK up, and three
    streamed responses abandoned in reference cycles: every one has its span and phases."""
    users, abandoned = 20, 3
    with mock_server("--ttfb", "0.05", "--tokens", "5") as mock:
        result = subprocess.run(
            [sys.executable, str(GEVENT_PROGRAM), mock.url, str(users)],
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_environment(OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="none"),
            check=False,
        )
    assert result.returncode == 0, result.stderr
    assert "DONE" in result.stdout, result.stdout
    spans = console_spans(result.stdout)
    requests = [span for span in spans if span.name == REQUEST]
    assert len(requests) == users + abandoned, result.stderr
    phases = phases_of(spans)
    for request in requests:
        # 127.0.0.1: no lookup. Each request opens a connection: each first request has a
        # session of its own, and an abandoned response keeps its connection.
        assert phases[request.span_id] >= {"http.connect", *PHASES}, phases[request.span_id]


# -- Locust ---------------------------------------------------------------------------------------


@dataclass
class LocustRun:
    stats: list[dict[str, Any]]  # Locust's final statistics, one entry per request name
    spans: list[Span]
    returncode: int
    output: str


@contextmanager
def locust_run(directory: Path, metrics_port: int) -> Iterator[LocustRun]:
    """``mock-server`` (a 429 every 20th request), then examples/locustfile.py under Locust,
    headless, exporting spans to an OTLP receiver and serving metrics on ``metrics_port``."""
    receiver = OTLPReceiver()
    try:
        with mock_server(
            "--ttfb", "0.3", "--tokens", str(TOKENS), "--rate-limit-every", "20"
        ) as mock:
            port = urllib.parse.urlsplit(mock.url).port
            stats = directory / "stats"
            environment = clean_environment(
                OTEL_SERVICE_NAME="locust",
                OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
                OTEL_METRICS_EXPORTER="prometheus",
                OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
                OTEL_EXPORTER_PROMETHEUS_PORT=str(metrics_port),
            )
            # fmt: off
            process = subprocess.run(
                [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE),
                 "--host", f"http://localhost:{port}", "--headless",
                 "-u", str(USERS), "-r", str(USERS), "-t", f"{RUN_SECONDS}s",
                 "--stop-timeout", "10", "--only-summary", "--json-file", str(stats)],
                cwd=directory, env=environment, capture_output=True, text=True,
                timeout=RUN_SECONDS + 60, preexec_fn=die_with_parent, check=False,
            )
            # fmt: on
        assert not receiver.bad_requests
        (stats_file,) = directory.glob("stats*.json")  # Locust adds .json
        yield LocustRun(
            json.loads(stats_file.read_text()),
            list(receiver.spans),
            process.returncode,
            process.stdout + process.stderr,
        )
    finally:
        receiver.stop()


def by_name(run: LocustRun) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in run.stats}


def check_locust_ran_without_errors(run: LocustRun) -> None:
    """Both tasks ran, many times; the only failures are the mock server's 429s (checked
    against the spans below), so Locust exits 1 (its code for a run with failures) and logs no
    exception."""
    stats = by_name(run)
    assert set(stats) == {"chat", "chat stream"}, run.output
    for entry in stats.values():
        assert entry["num_requests"] > USERS, entry
    assert "Traceback" not in run.output, run.output
    assert run.returncode == (1 if sum(e["num_failures"] for e in run.stats) else 0), run.output


def check_every_request_locust_counted_has_its_span(run: LocustRun) -> None:
    """Locust's final counts, by outcome, against the request spans: exactly as many."""
    stats = by_name(run)
    requests = [span for span in run.spans if span.name == REQUEST]
    answered = [span for span in requests if "http.response.status_code" in span.attributes]
    outcomes = Counter(
        (
            span.attributes["http.response.status_code"],
            "llm_latency.stream.events" in span.attributes,
        )
        for span in answered
    )
    failures = sum(entry["num_failures"] for entry in stats.values())
    assert outcomes == {
        (200, False): stats["chat"]["num_requests"] - stats["chat"]["num_failures"],
        (200, True): stats["chat stream"]["num_requests"] - stats["chat stream"]["num_failures"],
        (429, False): failures,
    }
    assert len(answered) == sum(entry["num_requests"] for entry in stats.values())
    # The rest: requests Locust interrupted when the run stopped (it kills a user that wakes up
    # from its wait just then, even with --stop-timeout; Locust does not count those).
    interrupted = [span for span in requests if span not in answered]
    assert {span.attributes.get("error.type") for span in interrupted} <= {"GreenletExit"}
    assert len(interrupted) <= USERS


def check_every_request_span_has_its_phases(run: LocustRun) -> None:
    phases = phases_of(run.spans)
    requests = [span for span in run.spans if span.name == REQUEST]
    new_connections = 0
    for span in requests:
        if "http.response.status_code" not in span.attributes:
            continue  # interrupted: it has the phases it got to
        found = phases.get(span.span_id, set())
        reused = span.attributes["llm_latency.connection.reused"]
        assert found == (PHASES if reused else PHASES | NEW_CONNECTION), (span, found)
        new_connections += not reused
    assert new_connections >= USERS  # a session, so a connection, per user
    streamed = [span for span in requests if "llm_latency.stream.events" in span.attributes]
    for span in streamed:  # read to the end: every event, and the time to the first one
        # every token, the finish_reason chunk, the usage chunk and [DONE]
        assert span.attributes["llm_latency.stream.events"] == TOKENS + 3, span
        assert span.attributes["gen_ai.response.time_to_first_chunk"] > 0, span
        assert span.attributes["gen_ai.usage.output_tokens"] == TOKENS, span
        assert span.attributes["llm_latency.time_per_output_token"] > 0, span


def check_nothing_is_dropped(run: LocustRun) -> None:
    """Every phase span's request span arrived, every span once, and the SDK said nothing of
    dropped spans or failed exports."""
    ids = Counter(span.span_id for span in run.spans)
    assert max(ids.values()) == 1
    requests = {span.span_id for span in run.spans if span.name == REQUEST}
    assert {span.parent_id for span in run.spans if span.name.startswith("http.")} <= requests
    assert {span.name for span in run.spans} <= {REQUEST, *PHASES, *NEW_CONNECTION}
    assert "dropped" not in run.output.lower(), run.output
    assert "llm-latency" not in run.output, run.output  # its warnings (export, faults)


def last_scrape(prometheus: Prometheus, job: str) -> float:
    """When Prometheus last scraped ``job`` successfully (the program has exited since)."""
    body = prometheus.get("/api/v1/query", query=f'up{{job="{job}"}}[10m]')
    (series,) = body["data"]["result"]
    return max(float(at) for at, value in series["values"] if value == "1")


def check_prometheus_answers_the_dashboards_queries(prometheus: Prometheus, run: LocustRun) -> None:
    """Each dashboard query, evaluated at Prometheus's last scrape of the run: data, except the
    ones in EXPECTED_EMPTY (exactly those)."""
    at = last_scrape(prometheus, "locust")
    empty = set()
    for query in dashboard_queries():
        body = prometheus.get("/api/v1/query", query=query.promql, time=str(at))
        assert body["status"] == "success", (query.where, body)
        if not body["data"]["result"]:
            empty.add(query.where)
    assert empty == EXPECTED_EMPTY
    counted = prometheus.get(
        "/api/v1/query",
        query='sum(http_client_request_duration_seconds_count{otel_scope_name="llm_latency"})',
        time=str(at),
    )
    (total,) = counted["data"]["result"]
    # Scraped before the last requests ended: some, and at most every request span.
    assert 0 < float(total["value"][1]) <= len([s for s in run.spans if s.name == REQUEST])


def test_the_locustfile_under_load(tmp_path: Path) -> None:
    """One Locust run (the module docstring), every check on it. One test, not one per check
    sharing a module fixture: with pytest 9.2, xdist's loadgroup no longer keeps a group on one
    worker, and each worker would run Locust again."""
    metrics_port = free_port()
    prometheus = Prometheus(tmp_path, metrics_port, job="locust")
    try:
        prometheus.wait_ready()
        with locust_run(tmp_path, metrics_port) as run:
            check_locust_ran_without_errors(run)
            check_every_request_locust_counted_has_its_span(run)
            check_every_request_span_has_its_phases(run)
            check_nothing_is_dropped(run)
            check_prometheus_answers_the_dashboards_queries(prometheus, run)
    finally:
        prometheus.stop()
