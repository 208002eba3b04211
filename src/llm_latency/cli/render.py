"""Showing results in the terminal (rich): phase waterfalls, percentile tables and findings.
(The HTML report is ``html_report``.)

The terminal output fits the console's width (clamped to 60-200 columns): this module breaks
its own lines, only at ordinary spaces, so a duration (``duration``: a no-break space between
number and unit) never wraps apart, and continuation lines are indented.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence

from rich.console import Console, RenderableType
from rich.segment import Segment, Segments
from rich.table import Table
from rich.text import Text

from llm_latency import semconv
from llm_latency.cli.results import RequestResult, StatusSummary, summarize_by_status
from llm_latency.cli.rhythm import rhythm, token_facts
from llm_latency.diagnosis.findings import NBSP, Finding, duration, keep_units
from llm_latency.timeline import PHASE_NAMES

PHASE_COLORS = {
    "queue": "#9b5de5",
    "dns": "#00bbf9",
    "connect": "#00f5d4",
    "proxy": "#fee440",
    "tls": "#4361ee",
    "send": "#f15bb5",
    "wait": "#e4572e",
    "receive": "#76b041",
    "backoff": "#adb5bd",
}
MIN_WIDTH, MAX_WIDTH = 60, 200
#: The value column of a waterfall: a right-aligned duration.
VALUE_WIDTH = 9
#: The label column: the longest phase name, and ``retry.backoff`` when a scene has one.
LABEL_WIDTH, BACKOFF_LABEL_WIDTH = 8, 14
#: The note shown beside a negative network overhead.
CLOCK_NOTE = "server reports more than the wait: its clock"


def ms(seconds: float | None) -> str:
    """Seconds as a short millisecond string."""
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def dur(seconds: float | None) -> str:
    """A duration for the terminal (``duration``: its unit never wraps apart), ``-`` if None."""
    return "-" if seconds is None else duration(seconds)


class _Console(Console):
    """A console that lets a broken pipe (``| head``) reach the command as BrokenPipeError,
    which stops the run (rich's own handler exits with code 1 from whichever thread
    printed)."""

    def on_broken_pipe(self) -> None:
        """Stop printing; tell the caller."""
        self.quiet = True
        raise BrokenPipeError


def make_console(stderr: bool = False) -> Console:
    """A console as wide as the terminal (or ``COLUMNS``), clamped to 60-200 columns."""
    detected = Console(stderr=stderr).width
    return _Console(stderr=stderr, width=max(MIN_WIDTH, min(MAX_WIDTH, detected)))


def wrap(text: str, width: int, indent: str = "", subsequent: str | None = None) -> list[str]:
    """``text`` in lines of at most ``width`` columns, broken at spaces but never between a
    number and its unit, the first line indented by ``indent``, the others by ``subsequent``
    (default: ``indent``)."""
    lines = textwrap.wrap(
        keep_units(text),
        width,
        initial_indent=indent,
        subsequent_indent=indent if subsequent is None else subsequent,
        break_on_hyphens=False,
    )
    return [line.replace(NBSP, " ") for line in lines] or [indent]


def pack(items: Iterable[str], width: int, indent: str, subsequent: str, sep: str) -> list[str]:
    """``items`` joined by ``sep`` in lines of at most ``width`` columns, never splitting an
    item unless it alone is too long for a line (then it is wrapped at its spaces). A line
    that continues ends with the separator's mark (``,`` of ``", "``)."""
    mark = sep.strip()
    limit = width - len(mark)
    lines: list[str] = []
    line = ""
    for item in items:
        if line and len(line) + len(sep) + len(item) <= limit:
            line += sep + item
            continue
        prefix = subsequent if lines or line else indent
        if line:
            lines.append(line + mark)
        if len(prefix) + len(item) <= limit:
            line = prefix + item
        else:
            *full, line = wrap(item, limit, prefix, subsequent)
            lines += full
    if line:
        lines.append(line)
    return lines


def print_trimmed(console: Console, renderable: RenderableType) -> None:
    """Print ``renderable`` (a table without borders, say) with no trailing spaces: rich pads
    each line to the table's width."""
    for line in console.render_lines(renderable, pad=False):
        segments = list(line)
        while segments and not segments[-1].control and not segments[-1].text.rstrip():
            segments.pop()
        if segments:
            last = segments[-1]
            segments[-1] = Segment(last.text.rstrip(), last.style, last.control)
        console.print(Segments([*segments, Segment.line()]), soft_wrap=True, end="")


def _print(console: Console, lines: Iterable[str | Text], style: str = "") -> None:
    """Print lines already broken to the console's width (rich must not break them again)."""
    for line in lines:
        console.print(line if isinstance(line, Text) else Text(line, style=style), soft_wrap=True)


def error_text(result: RequestResult, timeout: float | None = None) -> str:
    """Why the request failed. In ``probe``, a timeout error, or the cancellation that enforces
    the deadline of a client without a total timeout (httpx2), is the ``--timeout`` deadline."""
    error = result.error or "failed"
    if timeout is not None and ("Timeout" in error or error == "CancelledError"):
        return f"timed out: the {timeout:g} s --timeout deadline ({error})"
    return error


def facts(result: RequestResult) -> list[str]:
    """The request's facts: first byte (only when one came), first chunk, end, the server's
    time, the network's share, stream events."""
    items = []
    wait = next((t for t in result.timings if t.name == "wait"), None)
    if wait is not None and result.failed_phase != "wait":
        items.append(f"first byte {duration(wait.start + wait.duration)}")
    if result.time_to_first_chunk is not None:
        items.append(f"first chunk {duration(result.time_to_first_chunk)}")
    if result.time_to_first_token is not None:
        items.append(f"first token {duration(result.time_to_first_token)}")
    items.append(f"end {duration(result.total)}")
    items += token_facts(result)
    if result.server_processing is not None:
        # 0 from a header in whole ms (a refusal's, say) is below what it can tell, not 0.
        server = result.server_processing
        items.append(f"server {duration(server)}" if server > 0 else "server <1 ms")
    if result.network_overhead is not None:
        overhead = f"network+edge {duration(result.network_overhead)}"
        if result.network_overhead < 0:
            overhead += f" ({CLOCK_NOTE})"
        items.append(overhead)
    if result.stream_events is not None:
        items.append(f"{result.stream_events} events")
    if result.stream_mean_interval is not None:
        items.append(rhythm(result.stream_mean_interval, result.stream_chunk_rate))
    return items


def _bar_line(
    name: str, label: int, offset: float, length: float, bar: int, color: str, value: float
) -> Text:
    """``  name  ····████····  123 ms``: ``offset`` and ``length`` as shares of ``bar``."""
    start = min(max(round(offset * bar), 0), bar - 1)
    size = min(max(1, round(length * bar)), bar - start)
    line = Text(f"  {name:<{label}}")
    line.append(" " * start)
    line.append("█" * size if name != semconv.BACKOFF_SPAN else "░" * size, style=color)
    line.append(" " * (bar - start - size))
    line.append(f"{dur(value):>{VALUE_WIDTH}}")
    return line


def request_block(
    result: RequestResult,
    width: int,
    number: int | None = None,
    *,
    window: tuple[float, float] | None = None,
    label: int = LABEL_WIDTH,
    rate_limits: bool = True,
    timeout: float | None = None,
) -> list[Text]:
    """One request as lines of at most ``width`` columns: a header (number, status, total,
    connection, request id), a bar per phase, its facts, its rate-limit headers (unless
    ``rate_limits`` is False) and why it failed. ``window`` is (start, length) of the time
    scale in seconds, as ``result.start``; by default the request's own time."""
    origin, span = window or (result.start, result.total)
    span = span or 1e-9
    bar = max(10, width - 2 - label - VALUE_WIDTH - 1)
    if result.kind == "backoff":
        colour = PHASE_COLORS["backoff"]
        offset = (result.start - origin) / span
        lines = [_bar_line(semconv.BACKOFF_SPAN, label, offset, result.total / span, bar, colour,
                           result.total)]  # fmt: skip
        if result.error:
            lines += [Text(line, style="dim") for line in wrap(f"waiting after {result.error}",
                                                               width, "  ", "    ")]  # fmt: skip
        return lines
    shown = number if number is not None else result.number
    status = result.status if result.status is not None else result.error or "failed"
    head = [f"#{shown} {status}" if shown is not None else str(status), dur(result.total)]
    if result.reused is not None:
        head.append("pooled" if result.reused else "new connection")
    if result.resend_count:
        head.append(f"attempt {result.resend_count + 1}")
    if result.request_id:
        head.append(result.request_id)
    lines = [Text(line, style="bold") for line in pack(head, width, "", "   ", "  ")]
    for timing in result.timings:
        offset = (result.start + timing.start - origin) / span
        lines.append(
            _bar_line(timing.name, label, offset, timing.duration / span, bar,
                      PHASE_COLORS[timing.name], timing.duration)
        )  # fmt: skip
    lines += [Text(line, style="dim") for line in pack(facts(result), width, "  ", "    ", ", ")]
    if result.ratelimit and rate_limits:
        limits = [f"{k.removeprefix('x-ratelimit-')}={v}" for k, v in result.ratelimit.items()]
        limits[0] = f"rate limit: {limits[0]}"
        lines += [Text(line, style="dim") for line in pack(limits, width, "  ", "    ", ", ")]
    if result.error:
        where = f" in {result.failed_phase}" if result.failed_phase else ""
        message = f"failed{where}: {error_text(result, timeout)}"
        lines += [Text(line, style="red") for line in wrap(message, width, "  ", "    ")]
    return lines


def waterfall(
    console: Console,
    results: Sequence[RequestResult],
    title: str | None = None,
    rate_limits: bool = True,
) -> None:
    """One block per request, all on one time scale (from the first start to the last end),
    numbered in order, with the ``retry.backoff`` waits between attempts."""
    width = console.width
    if title:
        _print(console, wrap(title, width, "", "   "), style="bold")
    if not results:
        return
    origin = min(r.start for r in results)
    span = max(r.start + r.total for r in results) - origin
    label = BACKOFF_LABEL_WIDTH if any(r.kind == "backoff" for r in results) else LABEL_WIDTH
    number = 0
    for result in results:
        if result.kind == "request":
            number += 1
        block = request_block(result, width, number, window=(origin, span), label=label,
                              rate_limits=rate_limits)  # fmt: skip
        _print(console, block)


def summary_table(summary: dict[str, dict[str, float]], title: str = "percentiles") -> Table:
    """p50 / p95 / max per phase, total, first chunk, first token and time per output token
    (durations never wrap)."""
    table = Table(title=title, title_justify="left")
    table.add_column("phase", no_wrap=True)
    for column in ("p50", "p95", "max", "n"):
        table.add_column(column, justify="right", no_wrap=True)
    for name in (*PHASE_NAMES, "first_chunk", "first_token", "per_output_token", "total"):
        if name in summary:
            row = summary[name]
            table.add_row(
                name.replace("_", " "),
                dur(row["p50"]),
                dur(row["p95"]),
                dur(row["max"]),
                str(int(row["count"])),
            )
    return table


def status_title(name: str, summary: StatusSummary) -> str:
    """``percentiles, 2xx: 4 requests (200: 4)``."""
    plural = "s" if summary.requests != 1 else ""
    return f"percentiles, {name}: {summary.requests} request{plural} ({summary.detail()})"


def status_tables(console: Console, results: Sequence[RequestResult]) -> None:
    """A percentile table per status class (2xx, 4xx, 5xx, failed): a 429 answered at once
    and a success are not mixed in one percentile."""
    for name, summary in summarize_by_status(results).items():
        _print(console, wrap(status_title(name, summary), console.width, "", "  "), "italic")
        console.print(summary_table(summary.phases, title=""))


def findings_lines(findings: Sequence[Finding], width: int) -> list[Text]:
    """The findings, each numbered: its rule and cause with the evidence, the fix, the saving;
    continuation lines indented. A short line when there is none."""
    if not findings:
        return [Text("findings: none, nothing to change on this side was found", style="green")]
    lines = [Text("findings", style="bold")]
    for number, finding in enumerate(findings, 1):
        cause, fix, saving = finding.lines()
        lead = f"  {number}. "
        more = " " * len(lead)
        lines += [Text(line, style="yellow") for line in
                  wrap(f"{finding.rule}: {cause}", width, lead, more)]  # fmt: skip
        lines += [Text(line) for line in wrap(fix, width, more, more + "  ")]
        lines += [Text(line, style="green") for line in wrap(saving, width, more, more + "  ")]
    return lines


def print_findings(console: Console, findings: Sequence[Finding]) -> None:
    """The findings (:func:`findings_lines`) at the console's width."""
    _print(console, findings_lines(findings, console.width))
