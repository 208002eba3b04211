"""What ``llm-latency probe`` prints: text (each request as it finishes, then per URL the
percentiles per status class and the findings, then the comparison of several URLs), one JSON
object at the end (``--json``), or a JSON line per request as it finishes and a summary line
(``--jsonl``)."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.text import Text

from llm_latency.cli.compare_view import comparison
from llm_latency.cli.probe import Emit, UrlRun
from llm_latency.cli.render import (
    print_findings,
    request_block,
    status_tables,
    wrap,
)
from llm_latency.cli.results import RequestResult, summarize, summarize_by_status
from llm_latency.cli.rhythm import endpoint_decode, endpoint_rhythm
from llm_latency.diagnosis import Finding, diagnose
from llm_latency.diagnosis.usage_hint import usage_hint

MODES = ("text", "json", "jsonl")


def _percentiles(summary: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    return {k: {q: v[q] for q in ("p50", "p95", "max")} for k, v in summary.items()}


def json_report(
    runs: Mapping[str, UrlRun],
    findings: Mapping[str, list[Finding]],
    stopped: str | None = None,
    with_requests: bool = True,
) -> dict[str, Any]:
    """``--json``: ``requests`` (each with number, status, phases, request_id,
    time_to_first_chunk, total, ...; by number), ``summary`` (per phase p50/p95/max of the
    requests that succeeded), ``summary_by_status`` (per status class: requests, counts per
    status, percentiles), ``findings`` (per URL); ``endpoints`` and ``endpoints_by_status``
    per URL when several; ``interrupted`` when Ctrl-C stopped the run."""
    everything = [r for run in runs.values() for r in run.results]
    report: dict[str, Any] = {}
    if with_requests:  # URL by URL, each in the order the requests were sent
        ordered = [
            r for run in runs.values() for r in sorted(run.results, key=lambda r: r.number or 0)
        ]
        report["requests"] = [r.as_json() for r in ordered if r.kind == "request"]
    report["summary"] = _percentiles(summarize(everything))
    report["summary_by_status"] = {
        name: summary.as_json() for name, summary in summarize_by_status(everything).items()
    }
    report["findings"] = {url: [f.as_json() for f in found] for url, found in findings.items()}
    if len(runs) > 1:
        report["endpoints"] = {
            url: _percentiles(summarize(run.results)) for url, run in runs.items()
        }
        report["endpoints_by_status"] = {
            url: {name: s.as_json() for name, s in summarize_by_status(run.results).items()}
            for url, run in runs.items()
        }
    if stopped == "interrupted":
        report["interrupted"] = True
    return report


#: Decimals kept of each number in the JSON output: seconds to the nanosecond, the clocks'
#: resolution (not 0.30391636974999997). Fewer would round twice: a number read back from the
#: JSON and shown to three digits could differ from the report's own (107.5 µs: 107 or 108).
JSON_DECIMALS = 9


def rounded(value: Any) -> Any:
    """``value`` with every float rounded to :data:`JSON_DECIMALS` decimals, in lists and
    dicts too."""
    if isinstance(value, float):
        return round(value, JSON_DECIMALS)
    if isinstance(value, dict):
        return {key: rounded(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(item) for item in value]
    return value


class ProbeOutput:
    """Prints a probe in one of :data:`MODES`, as the run goes."""

    def __init__(self, mode: str, console: Console, timeout: float) -> None:
        self.mode = mode
        self.console = console
        self.timeout = timeout
        self.findings: dict[str, list[Finding]] = {}
        self._lock = threading.Lock()

    def begin(self, url: str, plan: str) -> None:
        """A URL's run starts (text: its heading, and what is sent)."""
        if self.mode == "text":
            self._lines([*wrap(url, self.console.width, "", "   ")], "bold")
            self._lines(wrap(plan, self.console.width, "", "  "), "dim")

    def emitter(self) -> Emit | None:
        """What prints each request as it finishes (on the printer thread), if anything."""
        if self.mode == "text":
            return self._text_request
        if self.mode == "jsonl":
            return self._json_request
        return None

    def end(self, url: str, run: UrlRun) -> None:
        """A URL's run ended: diagnose it; text: its percentiles per status class and its
        findings."""
        found = diagnose(run.spans)
        self.findings[url] = found
        if self.mode != "text":
            return
        if run.stopped == "interrupted":
            done = len([r for r in run.results if r.kind == "request"])
            finished = f"{done} request that finished" if done == 1 else f"{done} that finished"
            self._lines([f"interrupted: the summary of the {finished}"], "yellow")
        status_tables(self.console, run.results)
        hint = usage_hint(run.results, "; probe: --include-usage")
        for line in (endpoint_rhythm(run.results), endpoint_decode(run.results), hint):
            if line is not None:
                self._lines(wrap(line, self.console.width, "  ", "    "), "")
        print_findings(self.console, found)

    def finish(self, runs: Mapping[str, UrlRun], stopped: str | None) -> None:
        """Everything ran (or was stopped): the comparison, or the JSON object or line."""
        if self.mode == "text":
            if len(runs) > 1:
                comparison(self.console, {u: run.results for u, run in runs.items()})
            return
        report = json_report(runs, self.findings, stopped, with_requests=self.mode == "json")
        if self.mode == "jsonl":
            self._write(json.dumps(rounded({"type": "summary", **report})) + "\n")
        else:
            self._write(json.dumps(rounded(report), indent=2) + "\n")

    def note(self, text: str) -> None:
        """A line of text mode's output (``wrote FILE``)."""
        if self.mode == "text":
            self._lines(wrap(text, self.console.width), "")

    def _text_request(self, result: RequestResult) -> None:
        block = request_block(result, self.console.width, timeout=self.timeout)
        with self._lock:
            for line in block:
                self.console.print(line, soft_wrap=True)
            self.console.file.flush()

    def _json_request(self, result: RequestResult) -> None:
        self._write(json.dumps(rounded({"type": "request", **result.as_json()})) + "\n")

    def _lines(self, lines: list[str], style: str) -> None:
        with self._lock:
            for line in lines:
                self.console.print(Text(line, style=style), soft_wrap=True)

    def _write(self, text: str) -> None:
        with self._lock:
            sys.stdout.write(text)
            sys.stdout.flush()
