"""llm-latency never takes the program's providers: its spans and metrics land in the program's
own set-up whatever the order, and the SDK is set up from ``OTEL_*`` only when nothing else
will, with every registered exporter, and quietly when the collector is unreachable."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from llm_latency.lifecycle import EXIT_BUDGET_S
from tests.servers import LLMServer, unused_port

APP = Path(__file__).parent / "programs" / "app.py"


@dataclass
class Run:
    stdout: str
    stderr: str
    #: Seconds from the end of the program's calls to the end of the process.
    exit_delay: float

    def lines(self, prefix: str) -> list[str]:
        return [line for line in self.stdout.splitlines() if line.startswith(prefix)]

    def warnings(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def run_app(*args: str, pythonpath: str | None = None, **env: str) -> Run:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    # Where a forgotten set-up would send telemetry: nothing listens there.
    environment["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{unused_port()}"
    environment.update(env)
    if pythonpath is not None:
        environment["PYTHONPATH"] = pythonpath
    result = subprocess.run(
        [sys.executable, str(APP), *args],
        capture_output=True, text=True, env=environment, timeout=120, check=False,
    )  # fmt: skip
    ended = time.monotonic()
    assert result.returncode == 0, result.stderr
    (done,) = [line for line in result.stdout.splitlines() if line.startswith("DONE ")]
    return Run(result.stdout, result.stderr, ended - float(done.split()[1]))


async def app(*args: str, **env: str) -> Run:
    return await asyncio.to_thread(run_app, *args, **env)


@pytest.mark.parametrize("setup", ["before", "after"])
async def test_spans_and_metrics_land_in_the_programs_providers(
    server: LLMServer, setup: str
) -> None:
    run = await app(server.url(), "--setup", setup)
    assert "MINE POST /v1/chat/completions program-own" in run.lines("MINE")
    assert "MINE http.wait program-own" in run.lines("MINE")
    assert {"METRIC http.client.request.duration", "METRIC llm_latency.phase.duration"} <= set(
        run.lines("METRIC")
    )
    assert run.warnings() == []  # no "Overriding of current TracerProvider", no export errors


async def test_nothing_set_up_configures_the_sdk_from_the_environment(server: LLMServer) -> None:
    run = await app(
        server.url(), OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="none",
        OTEL_SERVICE_NAME="configured-by-env",
    )  # fmt: skip
    assert '"name": "http.wait"' in run.stdout
    assert '"service.name": "configured-by-env"' in run.stdout
    assert run.warnings() == []


async def test_any_registered_exporter_works(server: LLMServer, tmp_path: Path) -> None:
    # An exporter of the program's own (tests/programs/recording_exporter.py, importable
    # beside app.py), registered under the SDK's entry point by a dist-info of its own.
    dist = tmp_path / "recording_exporter-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: recording-exporter\nVersion: 1.0\n"
    )
    (dist / "entry_points.txt").write_text(
        "[opentelemetry_traces_exporter]\nrecording = recording_exporter:Recording\n"
    )
    run = await asyncio.to_thread(
        run_app, server.url(), pythonpath=str(tmp_path),
        OTEL_TRACES_EXPORTER="recording", OTEL_METRICS_EXPORTER="none",
    )  # fmt: skip
    assert "RECORDED http.wait" in run.lines("RECORDED")
    assert "RECORDED POST /v1/chat/completions" in run.lines("RECORDED")


@pytest.mark.parametrize("client", ["requests", "openai"])
async def test_an_unreachable_collector_costs_one_line_and_about_a_second(
    server: LLMServer, client: str
) -> None:
    run = await app(server.url(), "--client", client)
    # The same program with nothing to export: the process's own start-up and teardown, on
    # this machine at this moment.
    quiet = await app(
        server.url(), "--client", client, OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none"
    )
    (warning,) = run.warnings()
    assert warning.startswith("llm-latency: could not export ")
    assert "127.0.0.1" in warning
    assert len(warning) < 160, warning  # whole, not cut off, and says what to do
    assert warning.endswith("run a collector there, or set OTEL_TRACES_EXPORTER=none") or (
        warning.endswith("or set OTEL_METRICS_EXPORTER=none")
    ), warning
    # Bounded by the exit budget (1 s) beyond the quiet program's own exit; unbounded, the
    # exporters retry for their 10 s timeout. The margin is for a loaded machine's scheduling.
    assert run.exit_delay - quiet.exit_delay < 3 * EXIT_BUDGET_S, (run, quiet)


async def test_an_exporter_not_installed_costs_one_line(server: LLMServer) -> None:
    run = await app(server.url(), OTEL_TRACES_EXPORTER="not_installed")
    (warning,) = run.warnings()
    assert warning.startswith("llm-latency: could not set up the OpenTelemetry SDK from OTEL_*")
    assert "not_installed" in warning


async def test_no_sdk_installed_costs_one_line(server: LLMServer) -> None:
    run = await app(server.url(), "--no-sdk")
    (warning,) = run.warnings()
    assert "no OpenTelemetry SDK is set up and none is installed" in warning
    assert "llm-latency[otlp]" in warning


async def test_sdk_disabled_sets_nothing_up(server: LLMServer) -> None:
    run = await app(server.url(), OTEL_SDK_DISABLED="true", OTEL_TRACES_EXPORTER="console")
    assert '"name"' not in run.stdout
    assert run.warnings() == []
