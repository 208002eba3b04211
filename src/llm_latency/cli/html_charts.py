"""The HTML report's charts: every request of an endpoint on one labelled time axis (the
waterfall, with its legend), and the p50/p95 bars of the percentile tables, each drawn as plain
positioned boxes (no script, no image), on a round axis with its ticks inside the chart.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence

from llm_latency.cli.render import PHASE_COLORS
from llm_latency.cli.results import RequestResult, succeeded
from llm_latency.cli.rhythm import answer_facts
from llm_latency.diagnosis.findings import NBSP, duration

#: Waterfall rows drawn per endpoint; the percentiles and findings still cover every request.
MAX_ROWS = 300


def esc(text: object) -> str:
    """``text`` as HTML, fit for an element's text or a quoted attribute's value."""
    return html.escape(str(text), quote=True)


def _outcome(result: RequestResult) -> str:
    """``ok``, ``429``, ``5xx``, ``4xx`` or ``failed``: how the row is marked."""
    if succeeded(result):
        return "ok"
    if result.status is None or result.status < 400:
        return "failed"
    if result.status == 429:
        return "429"
    return "5xx" if result.status >= 500 else "4xx"


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


def waterfall(name: str, results: Sequence[RequestResult]) -> str:
    """The endpoint ``name``'s requests and backoffs, a row each (the first :data:`MAX_ROWS`),
    on one time axis from its first request: each attempt's phases as coloured segments."""
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
                f"<div class='note'>{esc(note)}</div></div>"
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
    note = f"<div class='note'>{esc('; '.join(notes))}</div>" if notes else ""
    answer = answer_facts(result)
    if answer is not None:
        note += f"<div class='facts'>{esc(answer)}</div>"
    return (
        f"<div class='wr o{outcome}'><div class='wl'><span class='num'>#{number}</span>"
        f"<span class='st s{outcome}'>{status}</span>{connection}</div>"
        f"<div class='track' {grid}>{''.join(segments)}</div>"
        f"<div class='wv'>{duration(result.total)}</div>{note}</div>"
    )


def bar_chart(rows: Sequence[tuple[str, str, Mapping[str, float]]], first: str, kind: str) -> str:
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


#: What the waterfall's colours and marks mean, shown above it.
LEGEND = (
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
