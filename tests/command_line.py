"""Running ``llm-latency`` in tests: in process (``run_cli``, the same ``main`` the entry point
calls, under click's ``CliRunner`` isolation of stdin, stdout, stderr and the environment), as
a subprocess where a test needs a real process (``run_cli_process``: signals, pipes, a
terminal), and ``mock_server``, the ``llm-latency mock-server`` subprocess a probe runs against.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from click.testing import CliRunner
from opentelemetry import metrics, trace

from llm_latency.cli import main
from llm_latency.instrumentor import LLMLatencyInstrumentor
from tests.servers import unused_port

#: The command as a subprocess: ``python -m llm_latency.cli``.
CLI = [sys.executable, "-m", "llm_latency.cli"]


@dataclass
class Result:
    """How a run of the command ended: its exit code and everything it printed."""

    returncode: int
    stdout: str
    stderr: str


def _runner() -> CliRunner:
    """A runner that keeps stderr apart from stdout (click 8.2 and later always do; 8.1, the
    oldest supported, when asked)."""
    if "mix_stderr" in inspect.signature(CliRunner).parameters:
        apart: dict[str, Any] = {"mix_stderr": False}
        return CliRunner(**apart)
    return CliRunner()


def _global_state() -> tuple[object, ...]:
    """What a command could leave behind: llm-latency's hooks, the global providers, the root
    logger's handlers, the SIGINT handler."""
    instrumented = LLMLatencyInstrumentor().is_instrumented_by_opentelemetry
    providers = trace.get_tracer_provider(), metrics.get_meter_provider()
    return (
        instrumented,
        *providers,
        logging.getLogger().handlers[:],
        signal.getsignal(signal.SIGINT),
    )


def as_a_terminals_job() -> None:
    """``preexec_fn`` of a command a test interrupts with SIGINT: its Ctrl-C is Python's, as
    for a job a terminal's shell starts. The suite may itself run with SIGINT ignored (started
    in the background of a non-interactive shell), which a child inherits, and a program that
    finds SIGINT ignored keeps it so (Python, and llm-latency's probe, do)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cli(
    *args: str, env: Mapping[str, str | None] | None = None, stdin: str | None = None
) -> Result:
    """``llm-latency ARGS`` in this process, with no ``OTEL_*`` variable but those of ``env``.
    It runs to its end (each probe instruments and uninstruments its own clients); what it
    prints is captured, and its exit code is the one the entry point would exit with. Not
    where an event loop runs (probe and demo start their own): there, ``run_cli_process``."""
    overrides: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OTEL_")}
    overrides.update(env or {})
    before = _global_state()
    with _runner().isolation(input=stdin, env=overrides) as streams:
        try:
            main(list(args))
        except SystemExit as ended:
            code = ended.code
        else:  # main always exits
            raise AssertionError("llm_latency.cli.main returned without exiting")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        out, err = streams[0].getvalue(), streams[1].getvalue()
    assert isinstance(code, int), code
    # What makes running in process sound: the command leaves the process as it found it.
    after = _global_state()
    assert after == before, [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    return Result(code, out.decode(), err.decode())


def environment(**extra: str) -> dict[str, str]:
    """This process's environment without ``OTEL_*``, plus ``extra``: for a subprocess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(extra)
    return env


def run_cli_process(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``llm-latency ARGS`` as a subprocess (``python -m llm_latency.cli``)."""
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env=environment(**(env or {})), check=False)  # fmt: skip


@dataclass
class Mock:
    url: str
    ca_file: str | None
    process: subprocess.Popen[str]


@contextmanager
def mock_server(*args: str) -> Iterator[Mock]:
    """``llm-latency mock-server ARGS`` on a free port, stopped (SIGTERM) at the end."""
    port = unused_port()
    process = subprocess.Popen([*CLI, "mock-server", "--port", str(port), *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "listening on" in line, line + (process.stderr.read() if process.stderr else "")
        url = line.split("listening on ")[1].strip()
        ca_file = None
        if "--tls" in args:
            ca_line = process.stdout.readline()
            ca_file = ca_line.split("CA certificate: ")[1].strip()
        yield Mock(url, ca_file, process)
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=10)


def one_error_line(result: Result | subprocess.CompletedProcess[str]) -> str:
    """Bad input: a non-zero exit and exactly one line on stderr, no traceback."""
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("llm-latency: error: ")
    return lines[0]


def probe_json(
    *args: str, env: Mapping[str, str | None] | None = None, exit_code: int = 0
) -> dict[str, Any]:
    """``llm-latency probe --json ARGS``: its report, after a run that ended with ``exit_code``
    (0: every request succeeded; 3: some got an error status)."""
    result = run_cli("probe", "--json", *args, env=env)
    assert result.returncode == exit_code, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report
