"""``probe URL1 URL2``'s comparison in the terminal: a column per endpoint, a row for its
requests, how they ended (status counts, failures) and every phase that was measured, receive
included; then the ranking, with each endpoint's failure rate beside its latency, and the phase
that accounts for most of the gap (``llm_latency.diagnosis.compare``). The HTML report reads
the same :func:`comparison_of`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.console import Console
from rich.table import Table

from llm_latency.cli.render import VALUE_WIDTH, _print, dur, wrap
from llm_latency.cli.results import RequestResult, succeeded, summarize
from llm_latency.diagnosis.compare import Comparison, Sample, compare
from llm_latency.timeline import PHASE_NAMES

#: The rows of the comparison, in order, when any endpoint measured them.
COMPARED_ROWS = (*PHASE_NAMES, "first_chunk", "total")


def outcome_of(result: RequestResult) -> str:
    """How a request ended: its status code, or ``failed in PHASE``."""
    if result.status is not None and result.error is None:
        return str(result.status)
    where = f" in {result.failed_phase}" if result.failed_phase else ""
    return f"failed{where}"


def comparison_of(
    runs: Mapping[str, Sequence[RequestResult]], names: Mapping[str, str]
) -> Comparison:
    """The endpoints compared (``runs`` by URL, ``names`` the label of each URL)."""
    return compare(
        {
            names[url]: [
                Sample(succeeded(r), outcome_of(r), r.total, r.phases)
                for r in results
                if r.kind == "request"
            ]
            for url, results in runs.items()
        }
    )


def tally(counts: Mapping[str, int]) -> str:
    """``200:4 429:2``: how the requests ended, most frequent first."""
    return " ".join(f"{outcome}:{n}" for outcome, n in counts.items())


def comparison(console: Console, runs: Mapping[str, Sequence[RequestResult]]) -> None:
    """Several endpoints side by side (numbered ``#1``, ``#2``, ...: a legend under the table
    maps them to the URLs), as many per table as the width holds; then the ranking and the
    main part of the gap."""
    urls = list(runs)
    names = {url: f"#{n}" for n, url in enumerate(urls, 1)}
    summaries = {url: summarize(results) for url, results in runs.items()}
    compared = comparison_of(runs, names)
    by_name = {e.name: e for e in compared.endpoints}
    rows = [p for p in COMPARED_ROWS if any(p in s for s in summaries.values())]
    per_table = max(1, (console.width - 20) // (VALUE_WIDTH + 3))
    for first in range(0, len(urls), per_table):
        chosen = urls[first : first + per_table]
        title = "endpoints compared"
        if len(urls) > per_table:
            title += (
                f" ({names[chosen[0]]}-{names[chosen[-1]]})"
                if len(chosen) > 1
                else (f" ({names[chosen[0]]})")
            )
        table = Table()
        table.add_column("", no_wrap=True)
        for url in chosen:
            table.add_column(names[url], justify="right", no_wrap=True)
        sides = [by_name[names[url]] for url in chosen]
        table.add_row("requests", *(str(e.requests) for e in sides))
        table.add_row("status", *(tally(e.outcomes) for e in sides))
        table.add_row("failed", *(f"{e.failure_rate * 100:.0f}%" for e in sides))
        for phase in rows:
            for q in ("p50", "p95"):
                cells = [
                    dur(summaries[u][phase][q]) if phase in summaries[u] else "-" for u in chosen
                ]
                table.add_row(f"{phase.replace('_', ' ')} {q}", *cells)
        _print(console, wrap(title, console.width), style="italic")
        console.print(table)
    legend = [line for url in urls for line in wrap(url, console.width, f"{names[url]} ", "   ")]
    _print(console, legend)
    _print(console, wrap(compared.ranking(), console.width, "", "  "))
    main = compared.main_finding()
    if main is not None:
        _print(console, wrap(f"main finding: {main}", console.width, "", "  "), style="bold")
