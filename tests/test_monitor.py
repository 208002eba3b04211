"""``llm-latency watch`` as a monitor: a probe loop against real mock servers on loopback.

One endpoint is made slow halfway through (its time to the first token grows by what the test
injects) and its inference series diverges from the other's; a refused endpoint is data and the
loop goes on; SIGTERM ends the process within one interval, with the last results exported over
OTLP; the series it serves for Prometheus are the ones the alert rules and their unit tests use.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import yaml
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families

from llm_latency.cli.monitor import Monitor, ProbeResult
from llm_latency.cli.monitor_config import EDGE, INFERENCE, parse_config
from llm_latency.cli.monitor_export import (
    PROBE_ENDPOINT,
    PROBE_KIND,
    PROBE_TIME_TO_FIRST_BYTE,
    probe_telemetry,
)
from llm_latency.testing.mock_server import Profile, running
from tests.checks import TRIES
from tests.command_line import CLI, Mock, environment, mock_server, run_cli_process
from tests.cpu_waits import collector_pauses, machine_waits, sampled_waits
from tests.otlp_receiver import OTLPReceiver
from tests.servers import unused_port

ROOT = Path(__file__).parents[1]
RULES_TEST = ROOT / "deploy/compose/prometheus/tests/llm-latency-probe.rules.test.yaml"
#: What the test adds to the slowed endpoint's time to first token (s).
SLOWER_BY = 0.4
FAST = Profile(ttfb=0.02, tokens=2, tokens_per_second=200)


def config(endpoints: list[dict[str, Any]], every: float) -> dict[str, Any]:
    return {
        "monitor": {"every": every, "min_interval": every, "jitter": 0.2, "max_in_flight": 2},
        "endpoint": endpoints,
    }


def ttfbs(results: list[ProbeResult], endpoint: str, kind: str, after: float = 0.0) -> list[float]:
    return [
        r.outcome.ttfb
        for r in results
        if r.endpoint == endpoint and r.kind == kind and r.started >= after and r.outcome.ttfb
    ]


async def test_series_diverge_when_one_endpoint_slows_and_a_refused_one_is_data() -> None:
    reader = InMemoryMetricReader()
    results: list[ProbeResult] = []
    async with running(FAST) as steady, running(FAST) as slowed:
        endpoints: list[dict[str, Any]] = [
            {"name": "steady", "url": steady.url("/v1"), "provider": "openai-compatible",
             "labels": {"region": "here"}},
            {"name": "slowed", "url": slowed.url("/v1"), "provider": "openai-compatible",
             "labels": {"region": "here"}},
            {"name": "refused", "url": f"http://127.0.0.1:{unused_port()}/v1",
             "provider": "openai-compatible", "kinds": ["edge"]},
        ]  # fmt: skip
        monitor_config = parse_config(config(endpoints, every=0.3))
        with probe_telemetry("test-watch", extra_readers=[reader]) as telemetry:
            monitor = Monitor(monitor_config, telemetry, results.append)
            running_monitor = asyncio.create_task(monitor.run())

            async def probes_of(endpoint: str, kind: str, count: int, after: float) -> None:
                while len([r for r in results if r.endpoint == endpoint and r.kind == kind
                           and r.started >= after]) < count:  # fmt: skip
                    assert not running_monitor.done()
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(probes_of("slowed", INFERENCE, 3, 0.0), 60)
            slowed.state.profile = replace(FAST, ttfb=FAST.ttfb + SLOWER_BY)
            halfway = time.time()
            await asyncio.wait_for(probes_of("slowed", INFERENCE, 3, halfway), 60)
            await asyncio.wait_for(probes_of("steady", INFERENCE, 3, halfway), 60)
            monitor.stop()
            await asyncio.wait_for(running_monitor, 30)
            data = reader.get_metrics_data()
    assert monitor.peak_in_flight <= 2

    # the slowed endpoint's inference series moved by what was injected; the steady one's not
    before = statistics.median(ttfbs(results, "slowed", INFERENCE)[:2])
    after = statistics.median(ttfbs(results, "slowed", INFERENCE, halfway)[1:])
    steady_after = statistics.median(ttfbs(results, "steady", INFERENCE, halfway)[1:])
    assert after - before >= 0.8 * SLOWER_BY
    assert after - steady_after >= 0.8 * SLOWER_BY
    # edge probes list the models, which the slowdown does not touch: never mixed in
    assert statistics.median(ttfbs(results, "slowed", EDGE, halfway)) < before + SLOWER_BY / 2

    # a refused endpoint: failed results with the error type and phase, and the loop went on
    refused = [r for r in results if r.endpoint == "refused"]
    assert len(refused) >= 2
    assert all(r.outcome.error and r.outcome.failed_phase == "connect" for r in refused)
    assert results[-1].started > refused[0].started

    # the metrics: one series per endpoint and kind, with the labels
    points: dict[tuple[str, str], HistogramDataPoint] = {}
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == PROBE_TIME_TO_FIRST_BYTE:
                    for point in metric.data.data_points:
                        attributes = dict(point.attributes or {})
                        key = (str(attributes[PROBE_ENDPOINT]), str(attributes[PROBE_KIND]))
                        assert isinstance(point, HistogramDataPoint)
                        points[key] = point
                        if key[0] != "refused":
                            assert attributes["region"] == "here"
    assert set(points) == {
        (name, kind) for name in ("steady", "slowed") for kind in (EDGE, INFERENCE)
    }
    mean = {key: point.sum / point.count for key, point in points.items()}
    assert mean["slowed", INFERENCE] - mean["steady", INFERENCE] >= 0.3 * SLOWER_BY


def _rule_test_series() -> set[tuple[str, frozenset[str]]]:
    """The metric names and label names the rules' unit tests feed promtool."""
    document = yaml.safe_load(RULES_TEST.read_text())
    shapes = set()
    for test in document["tests"]:
        for series in test["input_series"]:
            match = re.fullmatch(r"(\w+)\{(.*)\}", series["series"])
            assert match is not None, series
            labels = frozenset(re.findall(r"(\w+)=", match[2]))
            shapes.add((match[1], labels))
    return shapes


def _metric_sum(receiver: OTLPReceiver, name: str) -> float:
    total = 0.0
    for request in receiver.metric_requests:
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        total += sum(p.as_int or p.as_double for p in metric.sum.data_points)
    return total


@dataclass
class Stopped:
    """A ``watch`` run stopped by SIGTERM right after it printed its first inference probe:
    what it printed before and after the signal, what Prometheus scraped before it, what the
    OTLP receiver got, how long the process took to end after the signal (s), and what the
    machine took meanwhile (s): the run-queue waits of the watch process's threads and of the
    mock server's (sampled: the threads end with the process), and of this process's, whose
    thread is the receiver, and its garbage collector's pauses."""

    lines: list[str]
    out: str
    err: str
    returncode: int | None
    scraped: str
    receiver: OTLPReceiver
    took: float
    machine: float
    why: str


def watched_until_sigterm(path: Path, mock: Mock, key: str) -> Stopped:
    """Run ``watch`` on the config ``path``, exporting to a new OTLP receiver and serving
    Prometheus, and send it SIGTERM once it printed an inference probe."""
    receiver = OTLPReceiver()
    port = unused_port()
    env = environment(
        LLM_LATENCY_MONITOR_KEY=key,
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        OTEL_METRIC_EXPORT_INTERVAL="600000",  # no periodic export: only the last one
    )
    process = subprocess.Popen([*CLI, "watch", str(path), "--prometheus", f"127.0.0.1:{port}"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        assert process.stdout is not None
        lines: list[str] = []
        while sum(" inference " in line for line in lines) < 1 or len(lines) < 6:
            line = process.stdout.readline()
            assert line, process.stderr.read() if process.stderr else ""
            lines.append(line)
        with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            scraped = response.read().decode()
        # right after a probe printed: the next one is an interval away
        with (
            sampled_waits(process.pid, mock.process.pid) as sampled,
            machine_waits(os.getpid()) as waited,
            collector_pauses() as collected,
        ):
            process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            out, err = process.communicate(timeout=60)
            took = time.monotonic() - signalled
    finally:
        receiver.stop()
        if process.poll() is None:
            process.kill()
            process.wait()
    machine = sampled.total + waited.peers + collected.seconds
    why = (
        f"the machine kept the watch process and the mock server from a CPU for "
        f"{sampled.of(process.pid):.3f} s and {sampled.of(mock.process.pid):.3f} s, and this "
        f"process (the receiver) for {waited.peers:.3f} s; its garbage collector ran "
        f"{collected.seconds:.3f} s"
    )
    return Stopped(lines, out, err, process.returncode, scraped, receiver, took, machine, why)


def test_sigterm_ends_within_an_interval_with_the_last_results_exported(tmp_path: Path) -> None:
    """SIGTERM right after a probe printed ends the process well before the next probe is
    due, with the last results exported. What the process does after the signal (up to
    STOP_GRACE for the probes in flight, the last export, the interpreter's exit) is work a
    loaded machine delays: a run that ends late by no more than the machine measurably took
    from it (:class:`Stopped`) runs again, up to TRIES times; any other late end fails at once
    (the monitor waited for its next probe)."""
    # The next probe is due an interval less its jitter (28.5 s) after the last one began, at
    # the earliest: a monitor that waits for it ends more than half an interval after the
    # signal, where the work above took 1.9 to 2.5 s beside two CPU burners (load 12; the watch
    # process waited 1.2 to 2.0 s of it for a CPU) and 3.6 to 3.9 s at load 16 to 17 (an
    # interval of 3 s, less the 2 s grace, left 1 s for the last export and the exit).
    every, jitter = 30.0, 0.05
    bound = every / 2
    key = "sk-monitor-secret-0123456789"
    with mock_server("--ttfb", "0.02", "--tokens", "2") as mock:
        base = mock.url.rsplit("/v1/", 1)[0] + "/v1"
        path = tmp_path / "endpoints.toml"
        path.write_text(
            f'[monitor]\nevery = "{every}s"\nmin_interval = "1s"\njitter = {jitter}\n\n'
            f'[[endpoint]]\nname = "local"\nurl = "{base}"\nprovider = "openai"\n'
            f'api_key_env = "LLM_LATENCY_MONITOR_KEY"\nlabels = {{ region = "loopback" }}\n'
        )
        for _ in range(TRIES):
            stopped = watched_until_sigterm(path, mock, key)
            if stopped.took < bound or stopped.took - bound > stopped.machine:
                break
    assert stopped.returncode == 0, stopped.err
    assert stopped.took < bound, f"{stopped.took:.3f} s; {stopped.why}"
    lines = stopped.lines + stopped.out.splitlines(keepends=True)
    assert lines[-1].strip() == "llm-latency watch: stopped"
    printed = [line for line in lines if "  local  " in line]
    assert all(" 200 " in line for line in printed), printed
    assert "estimated calls per day: 2880 edge (no tokens), 2880 inference" in "".join(lines)
    assert key not in "".join(lines) + stopped.err + stopped.scraped
    receiver = stopped.receiver

    # the last results exported: every probe printed is a span and a count in the export
    probe_spans = [s for s in receiver.spans if s.name.startswith("probe local ")]
    assert len(probe_spans) == len(printed)
    request_spans = [s for s in receiver.spans if "url.full" in s.attributes]
    assert {s.attributes[PROBE_KIND] for s in request_spans} == {EDGE, INFERENCE}
    assert all(s.attributes["region"] == "loopback" for s in request_spans)
    assert _metric_sum(receiver, "llm_latency.probe.results") == len(printed)

    # what Prometheus scrapes has the names and labels the rule tests' series use
    served: dict[str, set[frozenset[str]]] = {}
    for family in text_string_to_metric_families(stopped.scraped):
        for sample in family.samples:
            served.setdefault(sample.name, set()).add(frozenset(sample.labels))
    for name, labels in _rule_test_series():
        assert name in served, (name, sorted(served))
        assert any(labels - {"job", "instance"} <= real for real in served[name]), (name, labels)


def test_a_bad_prometheus_address_is_one_error_line(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.toml"
    path.write_text(
        '[[endpoint]]\nname = "x"\nurl = "http://127.0.0.1:9/v1"\nprovider = "ollama"\n'
    )
    result = subprocess.run([*CLI, "watch", str(path), "--prometheus", "no-port"],
                            capture_output=True, text=True, env=environment(), timeout=60, check=False)  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip() == "llm-latency: error: --prometheus 'no-port' is not [HOST:]PORT"


def test_rounds_stops_after_that_many_probes_of_each_kind(tmp_path: Path) -> None:
    with mock_server("--ttfb", "0.01", "--tokens", "2") as mock:
        base = mock.url.rsplit("/v1/", 1)[0] + "/v1"
        path = tmp_path / "endpoints.toml"
        path.write_text(
            '[monitor]\nmin_interval = "0.2s"\n\n'
            f'[[endpoint]]\nname = "local"\nurl = "{base}"\nprovider = "openai-compatible"\n'
        )
        result = run_cli_process("watch", str(path), "--every", "0.2s", "--rounds", "2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len([line for line in lines if "  local  edge " in line]) == 2
    assert len([line for line in lines if "  local  inference " in line]) == 2
    assert lines[-1] == "llm-latency watch: stopped"


def test_a_4xx_is_a_failed_probe_with_its_status(tmp_path: Path) -> None:
    with mock_server("--ttfb", "0.01", "--tokens", "2") as mock:
        base = mock.url.rsplit("/v1/", 1)[0] + "/v1/missing"  # the mock answers 404
        path = tmp_path / "endpoints.toml"
        path.write_text(
            '[monitor]\nmin_interval = "0.2s"\n\n'
            f'[[endpoint]]\nname = "wrong"\nurl = "{base}"\nprovider = "openai-compatible"\n'
            'kinds = ["edge"]\n'
        )
        result = run_cli_process("watch", str(path), "--every", "0.2s", "--rounds", "2")
    assert result.returncode == 0, result.stderr
    failed = [line for line in result.stdout.splitlines() if "  wrong  edge " in line]
    assert len(failed) == 2
    assert all(
        line.split("  edge", 1)[1].strip().startswith("failed: status 404  (") for line in failed
    ), failed
