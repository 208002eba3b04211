"""``llm-latency watch CONFIG_FILE``: read the file, print the plan, run the monitor."""

from __future__ import annotations

import asyncio
import sys

from llm_latency.cli.errors import CLIError
from llm_latency.cli.monitor import ProbeResult, plan_lines, result_line, watch
from llm_latency.cli.monitor_config import load_config, parse_duration
from llm_latency.cli.monitor_export import probe_telemetry
from llm_latency.cli.redaction import scrubbed_logging
from llm_latency.cli.telemetry import otlp_endpoint


def parse_listen(value: str) -> tuple[str, int]:
    """``--prometheus``: ``PORT`` or ``HOST:PORT`` (``[::1]:PORT``), else a CLIError."""
    host, _, port = value.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise CLIError(f"--prometheus {value!r} is not [HOST:]PORT")
    return host, int(port)


def _print(result: ProbeResult) -> None:
    print(result_line(result), flush=True)


def run_watch(
    config_file: str, every: str | None, prometheus: str | None, rounds: int | None = None
) -> None:
    """Run ``watch`` until SIGTERM or SIGINT."""
    interval = None if every is None else parse_duration(every, "--every")
    listen = None if prometheus is None else parse_listen(prometheus)
    config = load_config(config_file, interval)
    for line in plan_lines(config):
        print(line, flush=True)
    if not otlp_endpoint() and listen is None:
        print(
            "no OTEL_EXPORTER_OTLP_ENDPOINT and no --prometheus: results are printed only",
            file=sys.stderr,
            flush=True,
        )
    urls = [endpoint.url for endpoint in config.endpoints]
    with (
        scrubbed_logging(urls),
        probe_telemetry("llm-latency-probe", listen) as telemetry,
    ):
        if listen is not None:
            print(f"metrics at http://{listen[0]}:{listen[1]}/metrics", flush=True)
        asyncio.run(watch(config, telemetry, _print, rounds))
    print("llm-latency watch: stopped", flush=True)
