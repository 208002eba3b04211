"""The bundle, started once for the end-to-end run, and the workloads that feed it.

The workloads start as soon as the bundle is up and run in the background while the checks
wait for what they need: the scripted calls over OTLP/HTTP and over OTLP/gRPC (a service
name each), and the alert scenarios.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.bundle import ADDRESSES, ROOT, Bundle, Service
from tests.e2e.kube import Cluster, agent_access, control_plane

#: How long the alert scenarios run: long enough for the traces checks before them, then for the
#: 31 s slow waits to end and Prometheus (15 s scrapes and rule evaluations) to see them.
ALERT_SECONDS = 150.0

RULES = ROOT / "deploy" / "compose" / "prometheus" / "rules"

#: The findings service's options for the run: a window of a minute (5 in compose) and a
#: diagnosis every 5 s (15), so that a finding shows within seconds and clears within a minute
#: of the fix (tests/e2e/test_advise.py).
ADVISE_WINDOW = 60.0
ADVISE_OVERRIDES = ["--window", str(ADVISE_WINDOW), "--interval", "5", "--settle", "2"]

#: What the checks saw, printed at the end of the run (the numbers behind deploy/README.md's
#: "What was checked").
SEEN: list[str] = []


def report(line: str) -> None:
    SEEN.append(line)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if SEEN:
        terminalreporter.section("what the bundle showed")
        for line in SEEN:
            terminalreporter.write_line(line)


@dataclass
class Workload:
    """A workload process and the spans it recorded."""

    service: str
    process: subprocess.Popen[bytes]
    record: Path
    log: Path
    #: When it was started (wall clock, s).
    started: float = 0.0

    def wait(self, timeout: float) -> None:
        code = self.process.wait(timeout)
        assert code == 0, f"{self.service} exited with {code}:\n{self.log.read_text()[-3000:]}"

    def spans(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stream_marks(self) -> dict[str, Any]:
        """``calls`` mode: the stream's times as the program saw them (``scripted_calls``)."""
        return dict(json.loads(self.record.with_suffix(".stream.json").read_text()))


def start_workload(
    directory: Path,
    mode: str,
    service: str,
    *args: str,
    endpoint: str = f"{ADDRESSES['otel-collector']}:4318",
    env: dict[str, str] | None = None,
) -> Workload:
    """Runs tests/e2e/workload.py in ``mode``; with ``env``, in that environment (OTEL_*)
    instead of the providers the workload sets up."""
    record = directory / f"{service}.spans.jsonl"
    log = directory / f"{service}.log"
    command = [sys.executable, "-m", "tests.e2e.workload", mode]
    if env is None:
        command += ["--service", service, "--endpoint", endpoint, "--record", str(record)]
        if mode == "calls":
            command += ["--stream-marks", str(record.with_suffix(".stream.json"))]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, *args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    return Workload(service, process, record, log, time.time())


@dataclass
class Run:
    """The running bundle and the workloads started with it."""

    bundle: Bundle
    directory: Path
    calls: dict[str, Workload]  # by protocol
    alerts: Workload

    @property
    def collector(self) -> Service:
        return self.bundle.services["otel-collector"]

    @property
    def jaeger(self) -> Service:
        return self.bundle.services["jaeger"]


#: The overrides that make alerts fire at once: the bundle's LLMRateLimited and LLMFixWouldSave
#: rules, each with a `for:` of 0 s and a name of its own, in a rules file of the test's beside
#: the bundle's (which run unchanged).
def _override_rules(directory: Path) -> Path:
    import yaml

    overrides = []
    for file, name in (
        ("llm-latency.rules.yaml", "LLMRateLimited"),
        ("llm-latency-advice.rules.yaml", "LLMFixWouldSave"),
    ):
        rules = yaml.safe_load((RULES / file).read_text())
        (rule,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == name]
        overrides.append({**rule, "alert": f"{name}Now", "for": "0s"})
    folder = directory / "rules"
    folder.mkdir()
    for rules_file in RULES.glob("*.yaml"):  # the programs' rules and the probe's
        shutil.copy(rules_file, folder / rules_file.name)
    (folder / "e2e-override.rules.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "e2e-override", "interval": "5s", "rules": overrides}]})
    )
    return folder


@pytest.fixture(scope="session")
def run() -> Iterator[Run]:
    directory = Path(tempfile.mkdtemp(prefix="llm-latency-e2e-"))
    bundle = Bundle(directory)
    bundle.compose_service("jaeger")
    bundle.compose_service("alertmanager")
    bundle.compose_service("prometheus", extra_binds=[(_override_rules(directory), RULES)])
    bundle.advise_service(ADVISE_OVERRIDES)
    bundle.compose_service("otel-collector")
    workloads: list[Workload] = []
    try:
        for service in bundle.services.values():
            service.start()
        grpc = f"{ADDRESSES['otel-collector']}:4317"
        calls = {
            "http": start_workload(directory, "calls", "e2e-http"),
            "grpc": start_workload(
                directory, "calls", "e2e-grpc", "--protocol", "grpc", endpoint=grpc
            ),
        }
        alerts = start_workload(directory, "alerts", "e2e-alerts", "--seconds", str(ALERT_SECONDS))
        workloads = [*calls.values(), alerts]
        yield Run(bundle, directory, calls, alerts)
    finally:
        for workload in workloads:
            if workload.process.poll() is None:
                workload.process.kill()
        bundle.stop()
        if os.environ.get("LLM_LATENCY_E2E_KEEP"):
            print(f"e2e logs kept in {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """etcd and a real kube-apiserver on loopback (tests/e2e/kube.py), for the probe chart's
    install and the agents' k8s_attributes."""
    plane = control_plane(tmp_path_factory.mktemp("control-plane"))
    try:
        plane.etcd.start()
        plane.api.start(timeout=120)
        yield plane
    finally:
        plane.stop()


@dataclass
class AgentPod:
    """What an agent collector's pod has beside its config: ``Bundle.helm_collector``'s binds
    and environment (its service account's token, the API server's address, its node)."""

    binds: list[tuple[Path, Path]]
    env: dict[str, str]


@pytest.fixture(scope="session")
def agent_pod(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> AgentPod:
    binds, env = agent_access(cluster, tmp_path_factory.mktemp("agent-pod"))
    return AgentPod(binds, env)
