"""``probe --html``: the report a person attaches to a ticket, as one self-contained page.

Top to bottom: the conclusion and the findings (``llm_latency.diagnosis``), the run's details
(date, the command with its secrets redacted, client, ``-n``/``-c``, stream, timeout), a
comparison of the endpoints when there are several, then per endpoint a waterfall of every
request on one labelled time axis (under a row, where the server counted the answer, its time
to first token, tokens and time per output token) and a percentile chart. Inline CSS only: no
script, no font or image to fetch, so the file opens the same anywhere, offline.

This module gathers what the page says and lays out its sections; the charts are drawn by
``html_charts``, the style sheet is ``html_style``.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import click
from click.core import ParameterSource

from llm_latency.cli.compare_view import comparison_of
from llm_latency.cli.html_charts import LEGEND, bar_chart, esc, waterfall
from llm_latency.cli.html_style import CSS
from llm_latency.cli.redaction import scrub
from llm_latency.cli.render import PHASE_COLORS
from llm_latency.cli.results import RequestResult, succeeded, summarize
from llm_latency.cli.rhythm import endpoint_decode, endpoint_rhythm
from llm_latency.diagnosis import Finding
from llm_latency.diagnosis.findings import NBSP, duration
from llm_latency.timeline import PHASE_NAMES
from llm_latency.version import __version__

#: Rows of the percentile charts, in this order, with how each is named.
CHART_ROWS = (
    *((p, p) for p in PHASE_NAMES),
    ("first_chunk", "first chunk"),
    ("first_token", "first token"),
    ("per_output_token", "per output token"),
    ("total", "total"),
)
#: Columns of the endpoint comparison (phase, percentile), shown when any endpoint has them:
#: every phase measured, receive included.
COMPARED = (
    *((p, "p50") for p in PHASE_NAMES),
    ("first_chunk", "p50"),
    ("total", "p50"),
    ("total", "p95"),
)
_TOTAL_COLOR = "#495057"


@dataclass(frozen=True)
class RunDetails:
    """How the probe ran: what a reader of the report needs to reproduce it. ``command`` is
    shown as it is: build it with :func:`command_line`, which redacts it."""

    started: datetime
    command: str
    client: str
    requests: int
    concurrency: int
    #: Whether the requests asked for a streamed answer (``--stream`` or the ``-d`` body).
    stream: bool
    fresh: bool
    timeout: float


def command_line(ctx: click.Context) -> str:
    """The command as given (options set on the command line, not defaults), with every URL's
    secrets and every header's value redacted: ``-H 'Authorization: REDACTED'``."""
    words = ["llm-latency", ctx.info_name or "probe"]
    urls: list[str] = []
    for param in ctx.command.params:
        name = param.name
        if name is None or ctx.get_parameter_source(name) is not ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[name]
        if isinstance(param, click.Argument):
            urls += [str(v) for v in value]
            continue
        flag = max(param.opts, key=len)
        if isinstance(param, click.Option) and param.is_flag:
            words.append(flag)
        elif name == "headers":
            for header in value:
                words += [flag, f"{str(header).partition(':')[0].strip()}: REDACTED"]
        else:
            words += [flag, str(value)]
    return scrub(shlex.join([*words, *urls]), urls)


def html_page(
    runs: Mapping[str, Sequence[RequestResult]],
    details: RunDetails,
    findings: Mapping[str, Sequence[Finding]],
    errors: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """The whole report as one HTML document. ``runs``, ``findings`` and ``errors`` (the error
    lines of the run) are keyed by each endpoint's shown (redacted) URL."""
    errors = errors or {}
    names = {url: f"E{i}" for i, url in enumerate(runs, 1)}
    summaries = {url: summarize(results) for url, results in runs.items()}
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>llm-latency probe report, {_date(details.started)}</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>llm-latency probe report</h1>",
        f"<p class='sub'>{_date(details.started)} · {_count(len(runs), 'endpoint')} · "
        f"{esc(details.client)}</p>",
        _findings_section(runs, names, summaries, findings, errors),
        _details_section(details, len(runs)),
    ]
    if len(runs) > 1:
        parts.append(_comparison_section(runs, names, summaries))
    for url, results in runs.items():
        parts.append(_endpoint_section(url, names[url], results, summaries[url], errors))
    parts.append("</body></html>")
    return "\n".join(parts)


# -- sections -------------------------------------------------------------------------------------


def _date(started: datetime) -> str:
    return started.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z").strip()


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _chip(name: str) -> str:
    return f"<span class='ep'>{name}</span>"


def _requests(results: Sequence[RequestResult]) -> list[RequestResult]:
    return [r for r in results if r.kind == "request"]


def _tally(results: Sequence[RequestResult]) -> str:
    """As HTML: ``3 &times; 200, 1 &times; 429, 1 failed in connect``."""
    answered: dict[int, int] = {}
    failed: dict[str, int] = {}
    for result in _requests(results):
        if result.status is not None:
            answered[result.status] = answered.get(result.status, 0) + 1
        else:
            where = f"failed in {result.failed_phase}" if result.failed_phase else "failed"
            failed[where] = failed.get(where, 0) + 1
    return ", ".join(
        [f"{n}{NBSP}&times;{NBSP}{status}" for status, n in sorted(answered.items())]
        + [f"{n} {esc(where)}" for where, n in sorted(failed.items())]
    )


def _conclusion(
    runs: Mapping[str, Sequence[RequestResult]],
    names: Mapping[str, str],
    summaries: Mapping[str, dict[str, dict[str, float]]],
    findings: Mapping[str, Sequence[Finding]],
) -> list[str]:
    """A sentence or two per endpoint, then which endpoint is fastest when there are several."""
    lines = []
    for url, results in runs.items():
        sent = _requests(results)
        total = summaries[url].get("total")
        timing = (
            f" Total p50{NBSP}{duration(total['p50'])}, p95{NBSP}{duration(total['p95'])}."
            if total
            else ""
        )
        own = findings.get(url, ())
        main = (
            f" {'Top' if len(runs) > 1 else 'Main'} finding: {esc(own[0].cause)}"
            if own
            else " No finding: nothing in these measurements stood out."
        )
        lines.append(
            f"{_chip(names[url])} {_count(len(sent), 'request')}: "
            f"{_tally(results) or 'none recorded'}.{timing}{main}"
        )
    if len(runs) > 1:
        compared = comparison_of(runs, names)
        lines.append(esc(compared.ranking()).replace(" times ", "&times; "))
        gap = compared.main_finding()
        if gap is not None:
            lines.append(f"Main finding: {esc(gap)}.")
    return lines


def _findings_section(
    runs: Mapping[str, Sequence[RequestResult]],
    names: Mapping[str, str],
    summaries: Mapping[str, dict[str, dict[str, float]]],
    findings: Mapping[str, Sequence[Finding]],
    errors: Mapping[str, Sequence[str]],
) -> str:
    parts = ["<section id='findings'><h2>Conclusion</h2><ul class='conclusion'>"]
    parts += [f"<li>{line}</li>" for line in _conclusion(runs, names, summaries, findings)]
    for url in runs:
        parts += [f"<li class='err'>{_chip(names[url])} {esc(e)}</li>" for e in errors.get(url, ())]
    parts.append("</ul><h2>Findings</h2>")
    for url in runs:
        own = findings.get(url, ())
        parts.append(f"<h3>{_chip(names[url])} <span class='url'>{esc(url)}</span></h3>")
        if not own:
            parts.append("<p class='none'>No finding: nothing in these measurements stood out.</p>")
            continue
        parts.append("<ol class='findings'>")
        for finding in own:
            saving = finding.saving.text() if finding.saving else "no client-side saving"
            parts.append(
                f"<li class='finding' data-rule='{esc(finding.rule)}'>"
                f"<p class='cause'>{esc(finding.cause)}</p>"
                f"<p class='evidence'>{esc(finding.evidence.text())}</p>"
                f"<p class='fix'><b>fix:</b> {esc(finding.fix)}</p>"
                f"<p class='saving'>{esc(saving)}</p></li>"
            )
        parts.append("</ol>")
    parts.append("</section>")
    return "\n".join(parts)


def _details_section(details: RunDetails, endpoints: int) -> str:
    rows = [
        ("date", _date(details.started)),
        ("command", f"<code>{esc(details.command)}</code>"),
        ("client", esc(details.client)),
        ("requests (-n)", f"{details.requests} per endpoint, {_count(endpoints, 'endpoint')}"),
        ("concurrency (-c)", str(details.concurrency)),
        ("stream", "yes" if details.stream else "no"),
        (
            "connections",
            "a new one per request (--fresh)" if details.fresh else "pooled (reused when free)",
        ),
        ("timeout", duration(details.timeout) + " per request"),
        ("llm-latency", __version__),
    ]
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f"<section id='details'><h2>Run details</h2><table class='kv'>{body}</table></section>"


def _comparison_section(
    runs: Mapping[str, Sequence[RequestResult]],
    names: Mapping[str, str],
    summaries: Mapping[str, dict[str, dict[str, float]]],
) -> str:
    columns = [(p, q) for p, q in COMPARED if any(p in s for s in summaries.values())]
    head = "".join(f"<th class='v'>{p.replace('_', ' ')} {q}</th>" for p, q in columns)
    parts = [
        "<section id='compare'><h2>Endpoints compared</h2><ol class='legend-eps'>",
        *(f"<li>{_chip(names[u])} <span class='url'>{esc(u)}</span></li>" for u in runs),
        "</ol><div class='cmp-wrap'><table class='cmp'><thead><tr><th>endpoint</th>"
        "<th class='v'>requests</th>"
        f"<th>outcome</th><th class='v'>failed</th>{head}</tr></thead><tbody>",
    ]
    for url, results in runs.items():
        summary = summaries[url]
        cells = "".join(
            f"<td class='v'>{duration(summary[p][q]) if p in summary else '-'}</td>"
            for p, q in columns
        )
        sent = _requests(results)
        failed = sum(1 for r in sent if not succeeded(r))
        rate = f"{failed / len(sent) * 100:.0f}%" if sent else "-"
        parts.append(
            f"<tr><td>{_chip(names[url])}</td><td class='v'>{len(sent)}</td>"
            f"<td class='outcome'>{_tally(results)}</td><td class='v'>{rate}</td>{cells}</tr>"
        )
    parts.append("</tbody></table></div>")
    rows = [
        (_chip(names[u]), _TOTAL_COLOR, s["total"]) for u, s in summaries.items() if "total" in s
    ]
    if rows:
        parts.append("<h3>Total time per endpoint</h3>")
        parts.append(bar_chart(rows, "endpoint", "cmp-chart"))
    parts.append("</section>")
    return "\n".join(parts)


def _endpoint_section(
    url: str,
    name: str,
    results: Sequence[RequestResult],
    summary: dict[str, dict[str, float]],
    errors: Mapping[str, Sequence[str]],
) -> str:
    parts = [
        f"<section class='endpoint' id='{name.lower()}'>",
        f"<h2>{_chip(name)} <span class='url'>{esc(url)}</span></h2>",
    ]
    parts += [f"<p class='err'>{esc(line)}</p>" for line in errors.get(url, ())]
    parts.append(f"<h3>Requests on one time axis</h3>{LEGEND}")
    parts.append(waterfall(name, results))
    for line in (endpoint_rhythm(results), endpoint_decode(results)):
        if line is not None:
            parts.append(f"<p class='rhythm'>{esc(line)}</p>")
    rows = [
        (label, PHASE_COLORS.get(key, _TOTAL_COLOR), summary[key])
        for key, label in CHART_ROWS
        if key in summary
    ]
    if rows:
        parts.append("<h3>Percentiles</h3>")
        parts.append(bar_chart(rows, "phase", "pct"))
    parts.append("</section>")
    return "\n".join(parts)
