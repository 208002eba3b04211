"""The current findings as a small HTML page and as JSON.

The page lists each window's findings, the largest share first: the cause, the evidence, the
fix and what it saves. ``?service=NAME`` (and ``&host=HOST``) narrows it to one service (one
host): the alert's notification and the dashboard link there. Every service and host in the
list links to its own view, and the page links to its JSON and to the metrics.
"""

from __future__ import annotations

import html
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

from llm_latency.advise.advisor import Advice, Snapshot
from llm_latency.diagnosis.findings import duration, percent


def selected(snapshot: Snapshot, service: str | None, host: str | None) -> list[Advice]:
    """The findings of ``service`` (and ``host``; None: all), the largest share first."""
    chosen = [
        advice
        for advice in snapshot.advice
        if (service is None or advice.service == service) and (host is None or advice.host == host)
    ]
    return sorted(chosen, key=lambda a: (-a.share, a.service, a.host, a.rule))


def as_json(snapshot: Snapshot, service: str | None = None, host: str | None = None) -> Any:
    """The findings as JSON-ready data: each with its window, fix, saving and evidence."""
    return {
        "at": snapshot.at,
        "windows": [
            {"service": w.service, "host": w.host, "calls": w.calls, "covered_seconds": w.covered}
            for w in snapshot.windows
            if (service is None or w.service == service) and (host is None or w.host == host)
        ],
        "findings": [
            {
                "service": advice.service,
                "host": advice.host,
                "rule": advice.rule,
                "saving_ratio": advice.share,
                "saving_seconds_per_minute": advice.per_minute,
                "saved_seconds": advice.saved,
                "calls": advice.calls,
                "covered_seconds": advice.covered,
                "finding": advice.finding.as_json(),
            }
            for advice in selected(snapshot, service, host)
        ],
    }


def link(service: str | None = None, host: str | None = None, path: str = "/") -> str:
    """The page's (or ``path``'s) address for ``service`` and ``host``."""
    query = {name: value for name, value in (("service", service), ("host", host)) if value}
    return path + ("?" + urllib.parse.urlencode(query) if query else "")


_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:70em;color:#222}
table{border-collapse:collapse;width:100%}th,td{padding:.4em .6em;vertical-align:top;
text-align:left;border-bottom:1px solid #ddd}th{background:#f4f4f4}.num{text-align:right;
white-space:nowrap}.fix{font-family:ui-monospace,monospace}.muted{color:#777}
"""


def page(snapshot: Snapshot, service: str | None = None, host: str | None = None) -> str:
    """The findings page (HTML)."""
    chosen = selected(snapshot, service, host)
    where = " ".join(filter(None, [service and f"of {service}", host and f"calling {host}"]))
    title = f"llm-latency findings {where}".strip()
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(snapshot.at))
        if snapshot.at
        else "not yet"
    )
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class=muted>Last diagnosis: {when}. <a id=all href="{link()}">All services</a> · '
        f'<a id=json href="{html.escape(link(service, host, "/findings.json"))}">JSON</a> · '
        f'<a id=metrics href="/metrics">Metrics</a></p>',
    ]
    if not chosen:
        parts.append("<p id=none>No findings: no fix would save time on these calls.</p>")
    else:
        parts.append(_table(chosen))
    parts.append(_windows(snapshot, service, host))
    parts.append("</body></html>")
    return "\n".join(parts)


def _table(chosen: Sequence[Advice]) -> str:
    rows = [
        "<table id=findings><thead><tr><th>Service</th><th>Host</th><th>Finding</th>"
        "<th>Fix</th><th class=num>Saves</th><th class=num>Per minute</th></tr></thead><tbody>"
    ]
    for advice in chosen:
        finding = advice.finding
        saving = finding.saving.text() if finding.saving is not None else "no client-side saving"
        rows.append(
            f'<tr class=finding data-rule="{html.escape(advice.rule)}">'
            f'<td><a class=service href="{html.escape(link(advice.service))}">'
            f"{html.escape(advice.service)}</a></td>"
            f'<td><a class=host href="{html.escape(link(advice.service, advice.host))}">'
            f"{html.escape(advice.host)}</a></td>"
            f"<td><b>{html.escape(advice.rule)}</b>: {html.escape(finding.cause)}"
            f"<br><span class=muted>{html.escape(finding.evidence.text())}</span></td>"
            f"<td class=fix>{html.escape(finding.fix)}<br>"
            f"<span class=muted>{html.escape(saving)}</span></td>"
            f"<td class=num>{percent(advice.share)} of the calls' time</td>"
            f"<td class=num>{duration(advice.per_minute)}</td></tr>"
        )
    rows.append("</tbody></table>")
    return "\n".join(rows)


def _windows(snapshot: Snapshot, service: str | None, host: str | None) -> str:
    rows = [
        f'<li><a class=window href="{html.escape(link(w.service, w.host))}">'
        f"{html.escape(w.service)} → {html.escape(w.host)}</a>: {w.calls} calls over "
        f"{duration(w.covered)}</li>"
        for w in snapshot.windows
        if (service is None or w.service == service) and (host is None or w.host == host)
    ]
    if not rows:
        return "<p class=muted>No calls in the window.</p>"
    return "<h2>Windows</h2><ul id=windows>" + "".join(rows) + "</ul>"
