"""``llm-latency explain FILE``: the calls of a saved trace, as trees, with their findings.

FILE is Jaeger's trace JSON (what its UI saves) or OTLP JSON (what the Collector's file
exporter writes); ``-`` reads standard input. Each trace is printed as the trees of its calls
(the same as the ``llm_latency_console`` exporter prints), then the findings of
:func:`llm_latency.diagnose` for that trace.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from llm_latency.call_tree import columns_for, report
from llm_latency.cli.errors import CLIError
from llm_latency.trace_files import TraceFileError, load


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


@click.command()
@click.argument("file")
def explain(file: str) -> None:
    """Explain a saved trace: each call's attempts, backoffs and phases, then the findings.

    FILE is Jaeger's trace JSON (the UI's JSON download) or OTLP JSON (the Collector's file
    exporter); '-' reads standard input.
    """
    text, name = read_text(file)
    try:
        traces = load(text, name)
    except TraceFileError as exc:
        raise CLIError(str(exc)) from None
    blocks = []
    width = columns_for(sys.stdout)
    for trace in traces:
        count = len(trace.calls)
        header = f"trace {trace.trace_id}: {count} call{'s' if count != 1 else ''}"
        blocks.append("\n".join([header, *report(trace.calls, width=width)]))
    click.echo("\n\n".join(blocks))
