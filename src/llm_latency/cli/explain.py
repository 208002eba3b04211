"""``llm-latency explain FILE``: the calls of a saved trace, as trees, with their findings.

FILE is Jaeger's trace JSON (what its UI saves) or OTLP JSON (what the Collector's file
exporter writes); ``-`` reads standard input. Each trace is printed as the trees of its calls
(the same as the ``llm_latency_console`` exporter prints), then the findings of
:func:`llm_latency.diagnose` for the file's calls together, as ``diagnose()`` reads a program's
spans: a program without a root span makes a trace per call, and one call is no evidence, but
its calls are. The calls of different programs (``service.name``) are diagnosed apart, each
with ``llm-latency watch``'s probe calls beside them (the ``us-or-them`` comparison).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import click

from llm_latency.call_tree import columns_for, finding_lines, tree
from llm_latency.cli.errors import CLIError
from llm_latency.diagnosis import diagnose
from llm_latency.diagnosis.records import Call
from llm_latency.diagnosis.us_or_them import is_probe
from llm_latency.trace_files import TraceCalls, load
from llm_latency.trace_json import TraceFileError


def read_text(file: str) -> tuple[str, str]:
    """The text of ``file`` (``-``: standard input) and the name to call it by."""
    try:
        if file == "-":
            return sys.stdin.read(), "standard input"
        return Path(file).read_text(encoding="utf-8"), file
    except UnicodeDecodeError:
        raise CLIError(f"{file} is not JSON (not UTF-8 text)") from None
    except OSError as exc:
        raise CLIError(f"cannot read {file}: {exc.strerror or exc}") from None


def service_of(call: Call) -> str:
    """The program that made ``call`` (its attempts' ``service.name``), "" when not known."""
    return next((a.service for a in call.attempts if a.service), "")


def by_service(traces: Sequence[TraceCalls]) -> dict[str, list[Call]]:
    """The file's calls per program, in start order; the probe's calls (``llm-latency watch``)
    beside each program's (none of their own: the probe is compared, not diagnosed)."""
    calls = sorted((c for trace in traces for c in trace.calls), key=lambda c: c.start_ns)
    probes = [call for call in calls if is_probe(call)]
    groups: dict[str, list[Call]] = {}
    for call in calls:
        if not is_probe(call):
            groups.setdefault(service_of(call), []).append(call)
    if not groups:
        groups[""] = []
    return {
        service: sorted(own + probes, key=lambda c: c.start_ns) for service, own in groups.items()
    }


def findings_header(service: str, calls: Sequence[Call], services: int) -> str:
    """``findings for app: 4 calls in 4 traces, diagnosed together`` (the probe's calls are not
    counted)."""
    own = [call for call in calls if not is_probe(call)]
    count, traces = len(own), len({call.trace_id for call in own})
    what = f"{count} call{'s' if count != 1 else ''} in {traces} trace{'s' if traces != 1 else ''}"
    who = f" for {service}" if service and services > 1 else ""
    return f"findings{who}: {what}, diagnosed together"


@click.command()
@click.argument("file")
def explain(file: str) -> None:
    """Explain a saved trace: each call's attempts, backoffs and phases, then the findings.

    FILE is Jaeger's trace JSON (the UI's JSON download) or OTLP JSON (the Collector's file
    exporter); '-' reads standard input. The findings are for all the file's calls together,
    per program (service.name).
    """
    text, name = read_text(file)
    try:
        traces = load(text, name)
    except TraceFileError as exc:
        raise CLIError(str(exc)) from None
    width = columns_for(sys.stdout)
    blocks = []
    for trace in traces:
        count = len(trace.calls)
        header = f"trace {trace.trace_id}: {count} call{'s' if count != 1 else ''}"
        # Offsets from the trace's own first call, as the console exporter shows a trace.
        blocks.append("\n".join([header, *tree(trace.calls, width=width)]))
    groups = by_service(traces)
    for service, calls in groups.items():
        lines = finding_lines(diagnose(calls), width)
        if len(traces) == 1 and len(groups) == 1:  # the trace's own findings, under its tree
            blocks[-1] += "\n" + "\n".join(lines)
            continue
        blocks.append("\n".join([findings_header(service, calls, len(groups)), *lines]))
    click.echo("\n\n".join(blocks))
