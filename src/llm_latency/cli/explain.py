"""``llm-latency explain FILE``: the calls of a saved trace, as trees, with their findings;
``llm-latency explain --jaeger URL --service NAME --since 1h``: those of a service's traces in
Jaeger (:mod:`llm_latency.jaeger_query`).

FILE is Jaeger's trace JSON (what its UI saves) or OTLP JSON (what the Collector's file
exporter writes); ``-`` reads standard input. Each trace is printed as the trees of its calls
(the same as the ``llm_latency_console`` exporter prints), then the findings of
:func:`llm_latency.diagnose` for the file's calls together, as ``diagnose()`` reads a program's
spans: a program without a root span makes a trace per call, and one call is no evidence, but
its calls are. The calls of different programs (``service.name``) are diagnosed apart, each
with ``llm-latency watch``'s probe calls beside them (the ``us-or-them`` comparison).

Traces a tail sampler kept (the spans say so, or ``--tail-sampled``) are biased toward slow
and failed calls: the output says so first, and each finding's share of time is called the
kept traces' share, never the service's.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from llm_latency.call_tree import columns_for, finding_lines, tree
from llm_latency.cli.errors import CLIError
from llm_latency.diagnosis import diagnose
from llm_latency.diagnosis.findings import Finding
from llm_latency.diagnosis.records import Call
from llm_latency.diagnosis.us_or_them import is_probe
from llm_latency.jaeger_query import TAIL_SAMPLED, Fetched, JaegerError, fetch, since_seconds
from llm_latency.trace_files import TraceCalls, calls_by_trace, load
from llm_latency.trace_json import TraceFileError

#: What a finding's share of time is of, in traces a tail sampler kept.
KEPT_SHARE = "the kept traces' time"


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


def sampled_warning(policies: Sequence[str], marked: bool = False) -> str:
    """The line that says the traces were tail-sampled (``marked``: their spans say so), and
    what that does to the findings."""
    if policies:
        how = f"the spans name the tail-sampling policies that kept them ({', '.join(policies)})"
    elif marked:
        how = f"the spans carry {TAIL_SAMPLED}, set by the gateway that kept them"
    else:
        how = "--tail-sampled"
    return (
        f"warning: these traces were tail-sampled ({how}): kept for being slow or failed more "
        "often than the rest, so they are not the service's calls; the findings describe the "
        f"kept traces, and their shares of time are of {KEPT_SHARE}, not the service's"
    )


def of_kept_traces(finding: Finding) -> Finding:
    """``finding`` with its share of time named as the kept traces' (a biased sample's)."""
    return dataclasses.replace(
        finding, evidence=dataclasses.replace(finding.evidence, share_of=KEPT_SHARE)
    )


def from_jaeger(url: str, service: str, since: str, limit: int) -> tuple[list[TraceCalls], Fetched]:
    """The calls of ``service``'s traces of the last ``since`` in Jaeger at ``url``, and what
    Jaeger gave (what the spans say of tail sampling)."""
    try:
        seconds = since_seconds(since)
        fetched = fetch(url, service, seconds, limit)
    except ValueError as exc:
        raise CLIError(f"--since: {exc}") from None
    except JaegerError as exc:
        raise CLIError(str(exc)) from None
    traces = [TraceCalls(t, calls) for t, calls in calls_by_trace(fetched.spans) if calls]
    if not traces:
        raise CLIError(
            f"Jaeger at {url} has no llm-latency calls of {service} in the last {since} "
            f"({len(fetched.spans)} spans)"
        )
    return traces, fetched


@click.command()
@click.argument("file", required=False)
@click.option(
    "--jaeger",
    "jaeger_url",
    metavar="URL",
    help="Read the traces from Jaeger's query service (http://jaeger:16686).",
)
@click.option("--service", metavar="NAME", help="With --jaeger: the service's traces.")
@click.option(
    "--since",
    default="1h",
    show_default=True,
    metavar="DURATION",
    help="With --jaeger: the traces that started this long ago or later (90s, 15m, 1h, 2d).",
)
@click.option(
    "--limit",
    default=1000,
    show_default=True,
    type=click.IntRange(min=1),
    help="With --jaeger: the most traces to read.",
)
@click.option(
    "--tail-sampled",
    is_flag=True,
    help="The traces were tail-sampled (when their spans do not say so).",
)
def explain(
    file: str | None,
    jaeger_url: str | None,
    service: str | None,
    since: str,
    limit: int,
    tail_sampled: bool,
) -> None:  # fmt: skip
    """Explain saved traces, or a service's in Jaeger: each call's attempts, backoffs and
    phases, then the findings.

    FILE is Jaeger's trace JSON (the UI's JSON download) or OTLP JSON (the Collector's file
    exporter); '-' reads standard input. Or --jaeger URL --service NAME [--since 1h]: the
    service's traces from Jaeger's query API. The findings are for all the calls together, per
    program (service.name).
    """
    fetched = Fetched([], False, [])
    if jaeger_url is not None:
        if file is not None or not service:
            raise CLIError("--jaeger URL takes --service NAME and no FILE")
        traces, fetched = from_jaeger(jaeger_url, service, since, limit)
    else:
        if file is None:
            raise CLIError("explain needs a FILE, or --jaeger URL --service NAME")
        text, name = read_text(file)
        try:
            traces = load(text, name)
        except TraceFileError as exc:
            raise CLIError(str(exc)) from None
    sampled = fetched.tail_sampled or tail_sampled
    width = columns_for(sys.stdout)
    blocks = [sampled_warning(fetched.policies, fetched.tail_sampled)] if sampled else []
    for trace in traces:
        count = len(trace.calls)
        header = f"trace {trace.trace_id}: {count} call{'s' if count != 1 else ''}"
        # Offsets from the trace's own first call, as the console exporter shows a trace.
        blocks.append("\n".join([header, *tree(trace.calls, width=width)]))
    groups = by_service(traces)
    for program, calls in groups.items():
        findings = diagnose(calls)
        if sampled:
            findings = [of_kept_traces(finding) for finding in findings]
        lines = finding_lines(findings, width)
        if len(traces) == 1 and len(groups) == 1:  # the trace's own findings, under its tree
            blocks[-1] += "\n" + "\n".join(lines)
            continue
        blocks.append("\n".join([findings_header(program, calls, len(groups)), *lines]))
    click.echo("\n\n".join(blocks))
