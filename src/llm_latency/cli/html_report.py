"""``probe --html``: the report a person attaches to a ticket, as one self-contained page.

Top to bottom: the conclusion and the findings (``llm_latency.diagnosis``), the run's details
(date, the command with its secrets redacted, client, ``-n``/``-c``, stream, timeout), a
comparison of the endpoints when there are several, then per endpoint a waterfall of every
request on one labelled time axis (under a row, where the server counted the answer, its time
to first token, tokens and time per output token) and a percentile chart. Inline CSS only: no
script, no font or image to fetch, so the file opens the same anywhere, offline.
"""

from __future__ import annotations

import html
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import click
from click.core import ParameterSource

from llm_latency.cli.compare_view import comparison_of
from llm_latency.cli.redaction import scrub
from llm_latency.cli.render import PHASE_COLORS
from llm_latency.cli.results import RequestResult, succeeded, summarize
from llm_latency.cli.rhythm import answer_facts, endpoint_decode, endpoint_rhythm
from llm_latency.diagnosis import Finding
from llm_latency.diagnosis.findings import NBSP, duration
from llm_latency.timeline import PHASE_NAMES
from llm_latency.version import __version__

#: Waterfall rows drawn per endpoint; the percentiles and findings still cover every request.
MAX_ROWS = 300
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
        f"<style>{_CSS}</style></head><body>",
        "<h1>llm-latency probe report</h1>",
        f"<p class='sub'>{_date(details.started)} · {_count(len(runs), 'endpoint')} · "
        f"{_esc(details.client)}</p>",
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


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _chip(name: str) -> str:
    return f"<span class='ep'>{name}</span>"


def _requests(results: Sequence[RequestResult]) -> list[RequestResult]:
    return [r for r in results if r.kind == "request"]


def _outcome(result: RequestResult) -> str:
    """``ok``, ``429``, ``5xx``, ``4xx`` or ``failed``: how the row is marked."""
    if succeeded(result):
        return "ok"
    if result.status is None or result.status < 400:
        return "failed"
    if result.status == 429:
        return "429"
    return "5xx" if result.status >= 500 else "4xx"


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
        + [f"{n} {_esc(where)}" for where, n in sorted(failed.items())]
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
            f" {'Top' if len(runs) > 1 else 'Main'} finding: {_esc(own[0].cause)}"
            if own
            else " No finding: nothing in these measurements stood out."
        )
        lines.append(
            f"{_chip(names[url])} {_count(len(sent), 'request')}: "
            f"{_tally(results) or 'none recorded'}.{timing}{main}"
        )
    if len(runs) > 1:
        compared = comparison_of(runs, names)
        lines.append(_esc(compared.ranking()).replace(" times ", "&times; "))
        gap = compared.main_finding()
        if gap is not None:
            lines.append(f"Main finding: {_esc(gap)}.")
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
        parts += [
            f"<li class='err'>{_chip(names[url])} {_esc(e)}</li>" for e in errors.get(url, ())
        ]
    parts.append("</ul><h2>Findings</h2>")
    for url in runs:
        own = findings.get(url, ())
        parts.append(f"<h3>{_chip(names[url])} <span class='url'>{_esc(url)}</span></h3>")
        if not own:
            parts.append("<p class='none'>No finding: nothing in these measurements stood out.</p>")
            continue
        parts.append("<ol class='findings'>")
        for finding in own:
            saving = finding.saving.text() if finding.saving else "no client-side saving"
            parts.append(
                f"<li class='finding' data-rule='{_esc(finding.rule)}'>"
                f"<p class='cause'>{_esc(finding.cause)}</p>"
                f"<p class='evidence'>{_esc(finding.evidence.text())}</p>"
                f"<p class='fix'><b>fix:</b> {_esc(finding.fix)}</p>"
                f"<p class='saving'>{_esc(saving)}</p></li>"
            )
        parts.append("</ol>")
    parts.append("</section>")
    return "\n".join(parts)


def _details_section(details: RunDetails, endpoints: int) -> str:
    rows = [
        ("date", _date(details.started)),
        ("command", f"<code>{_esc(details.command)}</code>"),
        ("client", _esc(details.client)),
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
        *(f"<li>{_chip(names[u])} <span class='url'>{_esc(u)}</span></li>" for u in runs),
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
        parts.append(_bar_chart(rows, "endpoint", "cmp-chart"))
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
        f"<h2>{_chip(name)} <span class='url'>{_esc(url)}</span></h2>",
    ]
    parts += [f"<p class='err'>{_esc(line)}</p>" for line in errors.get(url, ())]
    parts.append(f"<h3>Requests on one time axis</h3>{_LEGEND}")
    parts.append(_waterfall(name, results))
    for line in (endpoint_rhythm(results), endpoint_decode(results)):
        if line is not None:
            parts.append(f"<p class='rhythm'>{_esc(line)}</p>")
    rows = [
        (label, PHASE_COLORS.get(key, _TOTAL_COLOR), summary[key])
        for key, label in CHART_ROWS
        if key in summary
    ]
    if rows:
        parts.append("<h3>Percentiles</h3>")
        parts.append(_bar_chart(rows, "phase", "pct"))
    parts.append("</section>")
    return "\n".join(parts)


# -- the charts -----------------------------------------------------------------------------------


def _axis_end(span: float, most: int) -> tuple[float, list[float]]:
    """A round end at or past ``span`` and the ticks up to it: at most ``most`` steps of 1, 2,
    2.5 or 5 times a power of ten."""
    span = max(span, 1e-6)
    power = 10.0 ** math.floor(math.log10(span / most))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power * most >= span * (1 - 1e-9))
    count = max(1, math.ceil(span / step * (1 - 1e-9)))
    return step * count, [step * i for i in range(count + 1)]


def _tick_label(value: float, end: float) -> str:
    if value == 0:
        return "0"
    if end >= 1:
        return f"{round(value, 6):g}{NBSP}s"
    return f"{round(value * 1000, 6):g}{NBSP}ms"


def _axis(end: float, ticks: Sequence[float]) -> str:
    """Tick marks (``.tm``, at their time) and their labels (``.tick``), kept inside the axis:
    the first label starts at its mark, the last ends at its mark."""
    parts = ["<div class='axis'>"]
    for i, value in enumerate(ticks):
        left = 100 * value / end
        align = "first" if i == 0 else "last" if i == len(ticks) - 1 else "mid"
        mark = f"calc({left:.3f}% - 1px)" if align == "last" else f"{left:.3f}%"
        parts.append(
            f"<span class='tm' style='left:{mark}'></span>"
            f"<span class='tick {align}' style='left:{left:.3f}%' data-s='{value:.9g}'>"
            f"{_tick_label(value, end)}</span>"
        )
    parts.append("</div>")
    return "".join(parts)


def _place(start: float, length: float, end: float) -> str:
    """left/width on an axis ending at ``end``; at least 2 px wide, never past the end."""
    left = max(0.0, 100 * start / end)
    width = max(0.0, 100 * length / end)
    return f"left:min({left:.3f}%,calc(100% - 2px));width:max({width:.3f}%,2px)"


def _waterfall(name: str, results: Sequence[RequestResult]) -> str:
    if not results:
        return "<p class='none'>No request was recorded.</p>"
    shown = list(results[:MAX_ROWS])
    span = max(r.start + r.total for r in shown)
    end, ticks = _axis_end(span, 6)
    grid = f"style='background-size:{100 / (len(ticks) - 1):.4f}% 100%'"
    parts = [
        f"<div class='wf' data-endpoint='{name}'>",
        "<div class='wr axis-row'><div class='wl'><span>request · status · connection</span></div>"
        f"{_axis(end, ticks)}<div class='wv'><span>total</span></div></div>",
    ]
    number = 0
    for result in shown:
        if result.kind == "backoff":
            note = f"waiting after {result.error}" if result.error else "waiting to retry"
            parts.append(
                "<div class='wr backoff'>"
                "<div class='wl'><span class='bk'>retry.backoff</span></div>"
                f"<div class='track' {grid}><div class='seg bseg' "
                f"style='{_place(result.start, result.total, end)}'></div></div>"
                f"<div class='wv'>{duration(result.total)}</div>"
                f"<div class='note'>{_esc(note)}</div></div>"
            )
            continue
        number += 1
        parts.append(_request_row(number, result, end, grid))
    if len(results) > len(shown):
        parts.append(
            f"<p class='none'>{len(results) - len(shown)} more rows not drawn; the percentiles "
            "and findings cover every request.</p>"
        )
    parts.append(
        f"<div class='wr axis-row'><div class='wl'></div>{_axis(end, ticks)}"
        "<div class='wv'></div></div></div>"
    )
    parts.append(
        "<p class='caption'>Time since the first request to this endpoint. Each row is one "
        "HTTP attempt; its light band is the whole attempt, the colours its phases.</p>"
    )
    return "\n".join(parts)


def _request_row(number: int, result: RequestResult, end: float, grid: str) -> str:
    outcome = _outcome(result)
    status = result.status if result.status is not None else "failed"
    connection = {True: "<span class='cn pooled'>pooled</span>",
                  False: "<span class='cn new'>new conn</span>",
                  None: "<span class='cn'></span>"}[result.reused]  # fmt: skip
    segments = [
        f"<div class='env' style='{_place(result.start, result.total, end)}'></div>",
        *(
            f"<div class='seg{' failed' if t.name == result.failed_phase and result.error else ''}'"
            f" data-phase='{t.name}' title='{t.name} {duration(t.duration)}' "
            f"style='{_place(result.start + t.start, t.duration, end)};"
            f"background:{PHASE_COLORS[t.name]}'></div>"
            for t in result.timings
        ),
    ]
    notes = []
    if result.error:
        where = f" in {result.failed_phase}" if result.failed_phase else ""
        notes.append(f"failed{where}: {result.error}")
    if outcome == "429":
        retry = result.ratelimit.get("retry-after-ms")
        notes.append("rate-limited" + (f", retry after {retry} ms" if retry else ""))
    elif outcome == "5xx":
        notes.append(f"server error {result.status}")
    if result.resend_count:
        notes.append(f"attempt {result.resend_count + 1}")
    note = f"<div class='note'>{_esc('; '.join(notes))}</div>" if notes else ""
    answer = answer_facts(result)
    if answer is not None:
        note += f"<div class='facts'>{_esc(answer)}</div>"
    return (
        f"<div class='wr o{outcome}'><div class='wl'><span class='num'>#{number}</span>"
        f"<span class='st s{outcome}'>{status}</span>{connection}</div>"
        f"<div class='track' {grid}>{''.join(segments)}</div>"
        f"<div class='wv'>{duration(result.total)}</div>{note}</div>"
    )


def _bar_chart(rows: Sequence[tuple[str, str, Mapping[str, float]]], first: str, kind: str) -> str:
    """A table: per row its label, p50 (solid) and p95 (light) bars on one axis, and the
    numbers in their own cells. ``rows``: (label HTML, colour, p50/p95/max/count)."""
    end, ticks = _axis_end(max(row["p95"] for _, _, row in rows), 4)
    grid = f"style='background-size:{100 / (len(ticks) - 1):.4f}% 100%'"
    parts = [
        f"<table class='chart {kind}'><thead><tr><th>{first}</th>"
        "<th class='bars'><span class='key'><i class='k50'></i>p50 <i class='k95'></i>p95"
        "</span></th><th class='v'>p50</th><th class='v'>p95</th><th class='v'>max</th>"
        "<th class='v'>n</th></tr></thead><tbody>"
    ]
    for label, color, row in rows:
        parts.append(
            f"<tr><td class='name'>{label}</td><td class='bars'><div class='track' {grid}>"
            f"<div class='seg p95' style='{_place(0, row['p95'], end)};background:{color}'></div>"
            f"<div class='seg p50' style='{_place(0, row['p50'], end)};background:{color}'></div>"
            f"</div></td><td class='v'>{duration(row['p50'])}</td>"
            f"<td class='v'>{duration(row['p95'])}</td><td class='v'>{duration(row['max'])}</td>"
            f"<td class='v'>{int(row['count'])}</td></tr>"
        )
    parts.append(
        f"</tbody><tfoot><tr><td></td><td class='bars'>{_axis(end, ticks)}</td>"
        "<td colspan='4'></td></tr></tfoot></table>"
    )
    return "".join(parts)


_LEGEND = (
    "<p class='legend'>"
    + "".join(
        f"<span><i style='background:{color}'></i>{'retry.backoff' if n == 'backoff' else n}</span>"
        for n, color in PHASE_COLORS.items()
    )
    + "<span><span class='cn new'>new conn</span> opened a connection</span>"
    "<span><span class='cn pooled'>pooled</span> reused one</span>"
    "<span><span class='st s429'>429</span> rate-limited</span>"
    "<span><span class='st s5xx'>5xx</span> server error</span>"
    "<span><span class='st sfailed'>failed</span> no response</span></p>"
)

_CSS = """
*{box-sizing:border-box}
html{-webkit-print-color-adjust:exact;print-color-adjust:exact}
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#212529;
background:#fff;max-width:1200px}
h1{font-size:22px;margin:0}h2{font-size:17px;margin:28px 0 8px}h3{font-size:14px;margin:16px 0 6px}
.sub{color:#6c757d;margin:2px 0 12px}
.url{overflow-wrap:anywhere;font-weight:400;font-family:ui-monospace,monospace;font-size:13px}
code{white-space:pre-wrap;font-size:12.5px}
.ep{display:inline-block;min-width:26px;padding:0 5px;border-radius:3px;background:#343a40;
color:#fff;font-size:12px;font-weight:600;text-align:center}
.conclusion{padding-left:20px;margin:6px 0}.conclusion li{margin:4px 0}
.err{color:#b00020}.none{color:#6c757d}
.findings{padding-left:20px;margin:4px 0}.finding{margin:6px 0 10px}
.finding p{margin:1px 0}.cause{font-weight:600}.evidence,.saving{color:#495057;font-size:13px}
table{border-collapse:collapse}
.kv{table-layout:fixed;width:100%}
.kv th{width:150px;text-align:left;font-weight:500;color:#495057;padding:2px 16px 2px 0;
vertical-align:top}.kv td{padding:2px 0;overflow-wrap:break-word}
.legend-eps{padding-left:20px;margin:4px 0 8px}
.cmp,.chart{width:100%;margin:4px 0}
.cmp th,.cmp td,.chart th,.chart td{padding:3px 8px;border-bottom:1px solid #e9ecef;text-align:left}
.cmp th,.chart th{font-weight:600;font-size:12px;color:#495057}
.cmp th,.cmp td{padding:3px 5px}.cmp-wrap{overflow-x:auto}
.v{text-align:right!important;white-space:nowrap;font-variant-numeric:tabular-nums}
.name{white-space:nowrap}
.chart .bars{width:100%;min-width:120px}.chart tfoot td{border:0}
.key{font-weight:400}.key i{display:inline-block;width:12px;height:10px;margin:0 3px 0 8px;
background:#868e96}.key i.k95{opacity:.4}
.chart .track{height:14px}.chart .p95{opacity:.4}
.legend{font-size:12px;color:#495057;margin:4px 0 8px}
.legend>span{display:inline-block;margin:0 14px 3px 0;white-space:nowrap}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}
.wf{margin:4px 0}
.wr{display:grid;grid-template-columns:190px minmax(0,1fr) 72px;column-gap:10px;
align-items:center;min-height:20px;padding:1px 0}
.wr .note,.wr .facts{grid-column:2/4;font-size:12px;color:#495057;line-height:1.3;
padding-bottom:2px}
.wr.o5xx .note,.wr.ofailed .note{color:#b00020}
.wr.o429{background:#fff4e6}.wr.o5xx,.wr.ofailed{background:#ffe3e3}.wr.o4xx{background:#fff9db}
.wr.o429 .note{color:#8a4b00}
.wl{display:flex;gap:4px;align-items:center;font-size:12px;white-space:nowrap}
.axis-row .wl,.axis-row .wv{color:#6c757d;font-size:11px}
.num{width:40px;text-align:right;font-variant-numeric:tabular-nums;color:#495057}
.st{width:46px;text-align:center;border-radius:3px;font-weight:600;font-size:11px;
background:#d8f3dc;color:#1b4332}
.st.s429{background:#ffa94d;color:#3d1f00}.st.s5xx,.st.sfailed{background:#c1121f;color:#fff}
.st.s4xx{background:#ffe066;color:#3d3000}
.cn{display:inline-block;width:62px;text-align:center;font-size:11px;border-radius:3px}
.cn.new{background:#1d3557;color:#fff}.cn.pooled{border:1px solid #adb5bd;color:#495057}
.legend .st,.legend .cn{display:inline-block;margin-right:4px}
.bk{color:#6c757d;font-style:italic;padding-left:44px}
.wv{text-align:right;font-size:12px;white-space:nowrap;font-variant-numeric:tabular-nums}
.track{position:relative;height:16px;background-color:#f8f9fa;
background-image:linear-gradient(to right,#dee2e6 1px,transparent 1px);
border-right:1px solid #dee2e6}
.env{position:absolute;top:2px;height:12px;background:#e9ecef}
.seg{position:absolute;top:0;height:100%}
.wf .seg{top:2px;height:12px}
.seg.failed{box-shadow:inset 0 0 0 2px #b00020}
.bseg{background:repeating-linear-gradient(45deg,#adb5bd 0 4px,#e9ecef 4px 8px)}
.axis{position:relative;height:22px}
.tm{position:absolute;top:0;width:1px;height:5px;background:#868e96}
.tick{position:absolute;top:6px;font-size:11px;color:#495057;white-space:nowrap;
font-variant-numeric:tabular-nums}
.tick.mid{transform:translateX(-50%)}.tick.last{transform:translateX(-100%)}
.caption{font-size:12px;color:#6c757d;margin:2px 0 0}
"""
