"""Faults in the bundle under traffic: Jaeger stopped for 20 s, the Collector killed; and
Jaeger's retention.

Run last: they stop and restart the services the other checks read.
"""

from __future__ import annotations

import itertools
import re
import signal
import time
from typing import Any

import pytest

from llm_latency.lifecycle import EXIT_BUDGET_S
from tests.e2e.bundle import ADDRESSES, get_json, wait_for
from tests.e2e.conftest import Run, Workload, report, start_workload
from tests.e2e.test_metrics import query
from tests.e2e.test_traces import jaeger_traces

OUTAGE_S = 20.0
SCRAPE_S = 15.0  # deploy/compose/prometheus/prometheus.yaml


def _samples(run: Run, selector: str, start: float, end: float) -> list[tuple[float, float]]:
    """The raw samples Prometheus stored for ``selector`` between ``start`` and ``end``."""
    answer = get_json(
        run.bundle.url("prometheus", 9090, "/api/v1/query"),
        {"query": f"{selector}[{int(end - start) + 1}s]", "time": end},
    )
    (series,) = answer["data"]["result"]
    return [(float(t), float(v)) for t, v in series["values"]]


#: The services whose traces the Jaeger restart must keep: the session's first calls, over
#: both protocols, and the outage's workload.
KEPT_SERVICES = ("e2e-http", "e2e-grpc", "e2e-outage")


def _stored_spans(run: Run) -> dict[str, set[tuple[str, str]]]:
    """The (trace id, span id) of every span Jaeger shows for each of KEPT_SERVICES."""
    stored: dict[str, set[tuple[str, str]]] = {}
    for service in KEPT_SERVICES:
        traces = jaeger_traces(run, service)
        stored[service] = {(trace, span["spanID"]) for trace in traces for span in traces[trace]}
    return stored


def _badger_files(run: Run) -> list[str]:
    """The files of Jaeger's Badger database, in the run's folder for the jaeger-data volume."""
    folder = run.bundle.volume("jaeger", "jaeger-data")
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())


def test_jaeger_restarted_after_20_s_down_keeps_its_traces_and_loses_none_of_the_outage(
    run: Run,
) -> None:
    workload = start_workload(
        run.directory, "steady", "e2e-outage", "--seconds", "60", "--pause", "0.2"
    )
    wait_for(lambda: jaeger_traces(run, "e2e-outage"), timeout=60, what="the first traces")
    time.sleep(10)
    stored = _stored_spans(run)
    run.jaeger.stop()
    down = time.time()
    time.sleep(OUTAGE_S)
    run.jaeger.start()
    up = time.time()
    workload.wait(timeout=120)
    # Metrics do not go through Jaeger: a sample at every scrape through the outage, growing.
    time.sleep(SCRAPE_S + 5)
    selector = 'http_client_request_duration_seconds_count{job="e2e-outage"}'
    samples = _samples(run, selector, down - SCRAPE_S, up + SCRAPE_S)
    times = [t for t, _ in samples]
    assert times[0] <= down and times[-1] >= up, samples
    assert max(b - a for a, b in itertools.pairwise(times)) < 1.5 * SCRAPE_S, samples
    values = [v for _, v in samples]
    assert values == sorted(values) and values[-1] > values[0], samples
    # Badger, in the jaeger-data volume, keeps every span Jaeger showed before the stop (memory
    # storage starts empty); the ones queued in the Collector during the outage arrive too.
    assert all(stored.values()), {service: len(spans) for service, spans in stored.items()}
    after = _stored_spans(run)
    missing = {service: len(spans - after[service]) for service, spans in stored.items()}
    assert not any(missing.values()), f"spans stored before the stop, gone after it: {missing}"
    assert "jaeger/keys/MANIFEST" in _badger_files(run)
    recorded: dict[str, int] = {}
    for span in workload.spans():
        if span["parent_id"] is None and down < span["start"] / 1e9 and span["end"] / 1e9 < up:
            recorded[span["trace_id"]] = span["start"]
    assert len(recorded) > OUTAGE_S  # about five calls a second
    shown = wait_for(
        lambda: (t := jaeger_traces(run, "e2e-outage")) and set(recorded) <= set(t) and t,
        timeout=60,
        interval=2,
        what="the outage's traces",
    )
    assert set(recorded) <= set(shown)
    gap = max(b - a for a, b in itertools.pairwise(times))
    before = sum(len({trace for trace, _ in spans}) for spans in stored.values())
    report(
        f"Jaeger down {OUTAGE_S:.0f} s: the {before} traces stored before still shown after,"
        f" {len(recorded)} traces of the outage arrived after it;"
        f" metrics: {len(samples)} samples, longest gap {gap:.0f} s"
    )


def _warnings(workload: Workload) -> list[str]:
    """What the program printed besides the workload's own lines (calls, done)."""
    return [
        line
        for line in workload.log_text().splitlines()
        if not re.fullmatch(r"calls \d+|\w+ done in .*", line)
    ]


def _exit_seconds(workload: Workload, exited: float) -> float:
    (done,) = re.findall(r"done in [\d.]+ s at ([\d.]+)", workload.log_text())
    return exited - float(done)


def _lazy(run: Run, service: str, seconds: float) -> Workload:
    env = {
        "OTEL_SERVICE_NAME": service,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{ADDRESSES['otel-collector']}:4318",
        "OTEL_METRIC_EXPORT_INTERVAL": "1000",
        "OTEL_BSP_SCHEDULE_DELAY": "500",
    }
    return start_workload(
        run.directory,
        "steady",
        service,
        "--lazy",
        "--seconds",
        str(seconds),
        "--pause",
        "0.2",
        env=env,
    )


def test_collector_killed_the_program_goes_on_and_data_flows_after_a_restart(run: Run) -> None:
    workload = _lazy(run, "e2e-restart", 40)
    time.sleep(10)
    run.collector.stop(signal.SIGKILL)
    time.sleep(10)
    run.collector.start()
    restarted = time.time()
    workload.wait(timeout=120)
    exited = time.time()
    (calls,) = re.findall(r"calls (\d+)", workload.log_text())
    assert int(calls) > 40 / 0.2 * 0.5  # it went on calling through the outage
    warnings = _warnings(workload)
    assert len(warnings) == 1 and warnings[0].startswith("llm-latency: could not export"), warnings
    exit_seconds = _exit_seconds(workload, exited)
    assert exit_seconds < 5
    # After the restart: new traces in Jaeger, and the request count grows in Prometheus.

    def after_restart() -> list[Any]:
        traces = jaeger_traces(run, "e2e-restart")
        return [
            t for t, spans in traces.items() if min(s["startTime"] for s in spans) / 1e6 > restarted
        ]

    after = wait_for(after_restart, timeout=60, what="traces after the restart")
    assert len(after) > 10
    report(
        f"collector killed 10 s: {calls} calls went on, 1 warning line, exit {exit_seconds:.2f} s"
        f" after the work; {len(after)} traces after the restart"
    )
    count = 'max(http_client_request_duration_seconds_count{job="e2e-restart"})'
    wait_for(lambda: query(run, f"{count} > 0"), timeout=60, what="the count after the restart")


def test_collector_down_at_exit_costs_one_warning_and_about_a_second(run: Run) -> None:
    run.collector.stop(signal.SIGKILL)
    try:
        workload = _lazy(run, "e2e-down", 3)
        workload.wait(timeout=60)
        exited = time.time()
        warnings = _warnings(workload)
        assert len(warnings) == 1 and warnings[0].startswith("llm-latency: could not export"), (
            warnings
        )
        seconds = _exit_seconds(workload, exited)
        assert seconds < EXIT_BUDGET_S + 1.0, seconds  # and a second for the interpreter's own exit
        report(f"collector down at exit: 1 warning line, exit {seconds:.2f} s after the work")
    finally:
        run.collector.start()


@pytest.fixture(autouse=True)
def _services_back_up(run: Run) -> None:
    for service in (run.jaeger, run.collector):
        if service.process is None or service.process.poll() is not None:
            service.start()
