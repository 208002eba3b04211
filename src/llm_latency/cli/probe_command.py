"""``llm-latency probe``, the command: its options checked, each URL probed in turn, the
results printed as they come, the ``--html`` report written, the exit code chosen."""

from __future__ import annotations

import asyncio
import sys
from datetime import datetime, timezone
from pathlib import Path

import click

from llm_latency.cli.errors import CLIError
from llm_latency.cli.html_report import RunDetails, command_line, html_page
from llm_latency.cli.probe import UrlRun, error_lines, probe_url
from llm_latency.cli.probe_clients import CLIENT_NAMES, ProbeOptions
from llm_latency.cli.probe_input import (
    DEFAULT_MODEL,
    build_request,
    check_writable,
    parse_dns,
    parse_url,
)
from llm_latency.cli.probe_output import ProbeOutput
from llm_latency.cli.redaction import scrub, scrubbed_logging, shown
from llm_latency.cli.render import make_console
from llm_latency.cli.run_outcome import FAILED, exit_code, status_lines
from llm_latency.cli.telemetry import instrumented


@click.command()
@click.argument("urls", nargs=-1, required=True)
@click.option(
    "-n",
    "--requests",
    "count",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Requests per URL.",
)
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Requests in flight at once.",
)
@click.option("-X", "--method", help="HTTP method (default POST when there is a body, else GET).")
@click.option("-H", "--header", "headers", multiple=True, help="'Name: value' (repeatable).")
@click.option(
    "-d", "--data", help="Request body, or @file. Default for LLM routes: a short chat request."
)
@click.option("--stream", is_flag=True, help='Ask for a streamed response (sets "stream": true).')
@click.option(
    "--include-usage",
    is_flag=True,
    help='A streamed response with its token usage (sets "stream": true and "stream_options": '
    "{\"include_usage\": true}, which OpenAI's chat completions need to count a stream's tokens).",
)
@click.option(
    "--model", default=DEFAULT_MODEL, show_default=True, help="Model of the default body."
)
@click.option("--client", type=click.Choice(CLIENT_NAMES), default="aiohttp", show_default=True)
@click.option("--fresh", is_flag=True, help="A new connection for every request.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="Deadline of each request, in seconds: from sending it (waiting for a free "
    "connection included) to its last byte, streamed or not; the same for every client.",
)
@click.option("--cacert", type=click.Path(dir_okay=False), help="Trust this CA (PEM) for HTTPS.")
@click.option("--dns", help="Resolve through this DNS server (IP[:PORT]; aiohttp client only).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object at the end.")
@click.option(
    "--jsonl",
    is_flag=True,
    help="Print a JSON line per request as it finishes, then a summary line.",
)
@click.option(
    "--html",
    "html_file",
    type=click.Path(dir_okay=False),
    help="Also write a self-contained HTML report here.",
)
def probe(
    urls: tuple[str, ...],
    count: int,
    concurrency: int,
    method: str | None,
    headers: tuple[str, ...],
    data: str | None,
    stream: bool,
    include_usage: bool,
    model: str,
    client: str,
    fresh: bool,
    timeout: float,
    cacert: str | None,
    dns: str | None,
    as_json: bool,
    jsonl: bool,
    html_file: str | None,
) -> None:
    """httpstat for LLM endpoints: each request's phases as it finishes, then percentiles per
    status class and the diagnosis (findings, with fixes).

    API keys come from -H or from OPENAI_API_KEY / ANTHROPIC_API_KEY; they are never printed.
    Several URLs are compared side by side. Ctrl-C stops the run and reports the requests that
    finished (exit code 130).

    Exit codes: 0 when every request got a successful answer, 1 when a URL got none (every
    request to it was refused, timed out or answered 4xx/5xx) or the input was wrong, 3 when
    some requests failed but every URL answered at least once.
    """
    for url in urls:
        parse_url(url)
    if as_json and jsonl:
        raise click.UsageError("--json and --jsonl: choose one")
    if dns:
        parse_dns(dns)
        if client != "aiohttp":
            raise CLIError("--dns works with --client aiohttp only")
    if cacert and not Path(cacert).is_file():
        raise CLIError(f"cannot read the CA file {cacert}")
    if html_file:
        check_writable(html_file)
    requests_to_send = {
        url: build_request(url, method, headers, data, stream, model, include_usage) for url in urls
    }
    options = ProbeOptions(count, concurrency, fresh, timeout, cacert, dns)
    names = shown(urls)  # what the report calls each URL: redacted
    mode = "json" if as_json else "jsonl" if jsonl else "text"
    output = ProbeOutput(mode, make_console(), timeout)
    plan = (
        f"{count} request{'s' if count > 1 else ''} with {client}, {concurrency} at a time"
        + (", each on a new connection" if fresh else "")
        + "; each request's bars span its own time"
    )
    runs: dict[str, UrlRun] = {}
    failures: list[str] = []
    problems: dict[str, list[str]] = {}
    stopped: str | None = None
    started = datetime.now(timezone.utc)
    with scrubbed_logging(urls), instrumented("llm-latency-probe", [client]) as (collector, _, _):
        for url, request in requests_to_send.items():
            output.begin(names[url], plan)
            run = asyncio.run(probe_url(url, request, client, options, collector, output.emitter()))
            runs[names[url]] = run
            problems[names[url]] = error_lines(url, run.errors, timeout)
            problems[names[url]] += status_lines(names[url], run.results)
            failures += problems[names[url]]
            if run.stopped == "broken pipe":
                raise BrokenPipeError
            output.end(names[url], run)
            if run.stopped:
                stopped = run.stopped
                break
    output.finish(runs, stopped)
    if html_file:
        streamed = any(r.asks_to_stream() for r in requests_to_send.values())  # -d's too
        details = RunDetails(started, command_line(click.get_current_context()), client, count,
                             concurrency, streamed, fresh, timeout)  # fmt: skip
        results = {url: run.results for url, run in runs.items()}
        _write_html(html_file, html_page(results, details, output.findings, problems))
        output.note(f"wrote {html_file}")
    lines = "\n".join(f"llm-latency: error: {line}" for line in failures)
    if stopped == "interrupted":
        if failures:  # what failed before Ctrl-C is said too
            sys.stderr.write(scrub(lines) + "\n")
        raise KeyboardInterrupt
    code = exit_code({url: (run.results, len(run.errors)) for url, run in runs.items()})
    if code:  # every failure has its line; the fallback is for one that raised nothing
        fallback = "no successful answer" if code == FAILED else "some requests failed"
        raise CLIError(lines or f"llm-latency: error: {fallback}", raw=True, exit_code=code)


def _write_html(html_file: str, page: str) -> None:
    """``--html``: the report as one self-contained page."""
    try:
        Path(html_file).write_text(page, encoding="utf-8")
    except OSError as exc:
        raise CLIError(f"cannot write {html_file}: {exc.strerror or exc}") from None
