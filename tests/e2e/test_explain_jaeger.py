"""``llm-latency explain --jaeger``: the seed's pool-limited burst (tests/programs/pool_burst.py:
30 requests at once through an aiohttp pool of 5 per host) exported through the real Collector
to the real Jaeger, read back from Jaeger's query API for the last hour and diagnosed: the
first finding is the one ``diagnose()`` gives on the program's own spans."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from llm_latency import diagnose
from llm_latency.trace_files import load
from tests.command_line import mock_server, run_cli_process
from tests.e2e.bundle import ADDRESSES, get_json, wait_for
from tests.e2e.conftest import Run, report

BURST = Path(__file__).resolve().parents[1] / "programs" / "pool_burst.py"
#: A service of its own: explain --jaeger reads every trace of the service for the last hour, and
#: tests/e2e/test_advise.py sends bursts as e2e-burst (with and without the fix) in the same run.
SERVICE = "e2e-explain-burst"


def run_burst(url: str, service: str, endpoint: str) -> str:
    """The burst, exporting to the Collector at ``endpoint`` (OTLP over HTTP) and writing its
    own spans to stdout (OTLP JSON lines): those lines."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environment.update(
        OTEL_TRACES_EXPORTER="otlp,otlp_json_file",
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_METRICS_EXPORTER="none",
        OTEL_SERVICE_NAME=service,
    )
    result = subprocess.run([sys.executable, str(BURST), url], capture_output=True, text=True,
                            env=environment, timeout=120, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return "\n".join(line for line in result.stdout.splitlines() if line.startswith("{"))


def test_explain_jaeger_gives_the_first_finding_of_the_program_s_own_spans(run: Run) -> None:
    with mock_server("--ttfb", "0.3", "--tokens", "1") as mock:
        own = run_burst(mock.url, SERVICE, f"http://{ADDRESSES['otel-collector']}:4318")
    calls = [call for trace in load(own, "the program's spans") for call in trace.calls]
    assert len(calls) == 30
    (first, *_) = diagnose(calls)
    assert first.rule == "pool-queue", first
    jaeger = run.bundle.url("jaeger", 16686)
    wait_for(
        lambda: len(get_json(f"{jaeger}/api/traces", {"service": SERVICE, "lookback": "1h",
                                                        "limit": 100})["data"]) >= 30,
        timeout=60, what="the burst's 30 traces in Jaeger",
    )  # fmt: skip
    result = run_cli_process("explain", "--jaeger", jaeger, "--service", SERVICE,
                             "--since", "1h", timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    arrows = [line for line in result.stdout.splitlines() if line.startswith("→ ")]
    assert arrows and arrows[0].startswith(f"→ {first.cause}"), (arrows, first.cause)
    assert "tail-sampled" not in result.stdout  # the compose bundle keeps every trace
    report(f"explain --jaeger: {arrows[0][:100]}")
