"""Showing results in the terminal (rich): phase waterfalls and percentile tables. (The HTML
report is ``html_report``.)"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from llm_latency.cli.results import RequestResult
from llm_latency.timeline import PHASE_NAMES

PHASE_COLORS = {
    "queue": "#9b5de5",
    "dns": "#00bbf9",
    "connect": "#00f5d4",
    "tls": "#4361ee",
    "send": "#f15bb5",
    "wait": "#e4572e",
    "receive": "#76b041",
    "backoff": "#adb5bd",
}
BAR_WIDTH = 50


def ms(seconds: float | None) -> str:
    """Seconds as a short millisecond string."""
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def waterfall(
    console: Console,
    results: Sequence[RequestResult],
    title: str | None = None,
    rate_limits: bool = True,
) -> None:
    """One block per request: a bar per phase on a common time scale, then the facts (and the
    rate-limit headers, unless ``rate_limits`` is False)."""
    if title:
        console.print(f"\n[bold]{escape(title)}[/bold]")
    if not results:
        return
    span = max(r.start + r.total for r in results) or 1e-9
    scale = BAR_WIDTH / span
    number = 0
    for result in results:
        if result.kind == "backoff":
            line = Text(f"  {'retry.backoff':<13}")
            start = round(result.start * scale)
            line.append(
                " " * start + "░" * max(1, round(result.total * scale)),
                style=PHASE_COLORS["backoff"],
            )
            line.append(f"  {ms(result.total)}  waiting after {result.error}")
            console.print(line)
            continue
        number += 1
        status = result.status if result.status is not None else result.error or "failed"
        reused = {True: "pooled", False: "new connection", None: ""}[result.reused]
        resend = f"  attempt {result.resend_count + 1}" if result.resend_count else ""
        header = f"#{number} {status}  {ms(result.total)}  {reused}{resend}"
        if result.request_id:
            header += f"  {result.request_id}"
        console.print(Text(header, style="bold"))
        for timing in result.timings:
            line = Text(f"  {timing.name:<13}")
            start = round((result.start + timing.start) * scale)
            length = max(1, round(timing.duration * scale))
            line.append(" " * start)
            line.append("█" * length, style=PHASE_COLORS[timing.name])
            line.append(" " * max(0, BAR_WIDTH - start - length))
            line.append(f" {ms(timing.duration):>10}")
            console.print(line)
        facts = []
        if "wait" in result.phases:
            first_byte = next(t for t in result.timings if t.name == "wait")
            facts.append(f"first byte {ms(first_byte.start + first_byte.duration)}")
        if result.time_to_first_chunk is not None:
            facts.append(f"first chunk {ms(result.time_to_first_chunk)}")
        facts.append(f"end {ms(result.total)}")
        if result.server_processing is not None:
            facts.append(f"server {ms(result.server_processing)}")
        if result.network_overhead is not None:
            facts.append(f"network+edge {ms(result.network_overhead)}")
        if result.stream_events is not None:
            facts.append(f"{result.stream_events} events")
        console.print("  " + ", ".join(facts), style="dim")
        if result.ratelimit and rate_limits:
            limits = ", ".join(
                f"{k.removeprefix('x-ratelimit-')}={v}" for k, v in result.ratelimit.items()
            )
            console.print(f"  rate limit: {limits}", style="dim")
        if result.error:
            where = f" in {result.failed_phase}" if result.failed_phase else ""
            console.print(f"  failed{where}: {result.error}", style="red")


def summary_table(summary: dict[str, dict[str, float]], title: str = "percentiles") -> Table:
    """p50 / p95 / max per phase, total and first chunk."""
    table = Table(title=title, title_justify="left")
    table.add_column("phase")
    for column in ("p50", "p95", "max", "n"):
        table.add_column(column, justify="right")
    for name in (*PHASE_NAMES, "first_chunk", "total"):
        if name in summary:
            row = summary[name]
            table.add_row(
                name, ms(row["p50"]), ms(row["p95"]), ms(row["max"]), str(int(row["count"]))
            )
    return table


def comparison_table(summaries: dict[str, dict[str, dict[str, float]]]) -> Table:
    """Several endpoints side by side: p50 / p95 of the main phases and of the total."""
    table = Table(title="endpoints compared", title_justify="left")
    table.add_column("endpoint")
    columns = [
        (p, q)
        for p in ("dns", "connect", "tls", "wait", "first_chunk", "total")
        for q in ("p50", "p95")
    ]
    shown = [(p, q) for p, q in columns if any(p in s for s in summaries.values())]
    for phase, q in shown:
        table.add_column(f"{phase} {q}", justify="right")
    for url, summary in summaries.items():
        table.add_row(url, *(ms(summary[p][q]) if p in summary else "-" for p, q in shown))
    return table
