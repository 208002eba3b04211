"""The click commands behind ``llm-latency``."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click

from llm_latency.cli.errors import CLIError, OutputGone
from llm_latency.cli.explain import explain
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
from llm_latency.testing.mock_server import Profile, log_to_stderr, running

#: The exit code after the reader of the output went away (``| head``): 128 + SIGPIPE, as a
#: Unix tool killed by SIGPIPE reports in the shell.
BROKEN_PIPE_EXIT = 141


class _Commands(click.Group):
    """The command group; a broken pipe in any command reaches :func:`run` as OutputGone."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise OutputGone from None


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="llm-latency")
def cli() -> None:
    """Where did the time of an LLM API call go? DNS, TCP, TLS, the server, or the stream."""


@cli.command()
def demo() -> None:
    """Scenes against a built-in mock server: pooling, streaming, queueing, retries."""
    from llm_latency.cli.demo import main as run_demo

    run_demo(make_console())


@cli.command()
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
        url: build_request(url, method, headers, data, stream, model) for url in urls
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


@cli.command("mock-server")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--tls", is_flag=True, help="HTTPS with a throwaway CA (its PEM path is printed).")
@click.option(
    "--ttfb",
    type=click.FloatRange(min=0),
    default=0.3,
    show_default=True,
    help="Seconds before the first byte (OpenAI's openai-processing-ms reports it).",
)
@click.option(
    "--tokens-per-second",
    type=click.FloatRange(min=0, min_open=True),
    default=50.0,
    show_default=True,
)
@click.option(
    "--tokens",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="Tokens in each answer (a request's max_tokens caps it).",
)
@click.option(
    "--prefill-per-token",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds of prefill per prompt token (the prompt's words), before the first token.",
)
@click.option(
    "--slots",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Answers generated at once; the others queue for a slot (0: no limit).",
)
@click.option(
    "--rate-limit-every",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Answer every N-th request with 429 and retry-after (0: never).",
)
@click.option("--retry-after-ms", type=click.IntRange(min=0), default=250, show_default=True)
@click.option(
    "--error-rate",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="Share of requests answered with 500.",
)
@click.option(
    "--tls-delay",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds added to each TLS handshake.",
)
@click.option("--seed", type=int, help="Seed for --error-rate.")
def mock_server(
    host: str,
    port: int,
    tls: bool,
    ttfb: float,
    tokens_per_second: float,
    tokens: int,
    prefill_per_token: float,
    slots: int,
    rate_limit_every: int,
    retry_after_ms: int,
    error_rate: float,
    tls_delay: float,
    seed: int | None,
) -> None:
    """A mock LLM server with a realistic latency profile (Ctrl-C to stop).

    \b
    It speaks three APIs, streamed or not, each as its SDK reads it:
      OpenAI     POST /v1/chat/completions, GET /v1/models
      Anthropic  POST /v1/messages
      Ollama     POST /api/chat, POST /api/generate, GET /api/tags
    The same profile for all, as a model server behaves: a free slot, then the time to the
    first byte and the prefill of the prompt, then tokens at their pace, usage as each
    provider reports it; scripted 429s and 500s. Any other path is a 404.
    """
    profile = Profile(
        ttfb=ttfb,
        tokens_per_second=tokens_per_second,
        tokens=tokens,
        prefill_per_token=prefill_per_token,
        slots=slots,
        rate_limit_every=rate_limit_every,
        retry_after_ms=retry_after_ms,
        error_rate=error_rate,
        tls_delay=tls_delay,
        seed=seed,
    )
    log_to_stderr()
    asyncio.run(_serve(profile, host, port, tls))


async def _serve(profile: Profile, host: str, port: int, tls: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with running(profile, host=host, port=port, tls=tls) as server:
            print(f"llm-latency mock-server listening on {server.url()}", flush=True)
            if server.ca_file is not None:
                print(f"CA certificate: {server.ca_file}", flush=True)
            await stop.wait()
    except OSError as exc:
        raise CLIError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    print("llm-latency mock-server stopped", flush=True)


@cli.command()
@click.argument("config_file", type=click.Path(dir_okay=False))
@click.option(
    "--every",
    help="Each endpoint's interval (30s, 2m), unless the file sets its own. Default: the "
    "file's [monitor] every, else 60s.",
)
@click.option(
    "--prometheus",
    metavar="[HOST:]PORT",
    help="Also serve the metrics at http://HOST:PORT/metrics for Prometheus (HOST: 127.0.0.1).",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    help="Stop after this many probes of each endpoint and kind (default: run until stopped).",
)
def watch(config_file: str, every: str | None, prometheus: str | None, rounds: int | None) -> None:
    """Probe the endpoints of CONFIG_FILE (TOML) until stopped: a synthetic monitor.

    Each endpoint gets an edge probe (a model listing: DNS, connect, TLS, first byte) and an
    inference probe (one output token, streamed), each its own series. Results are printed
    one line each and exported over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set. SIGTERM or
    Ctrl-C stops it. Keys come from the environment variables the file names.
    """
    from llm_latency.cli.monitor_command import run_watch

    run_watch(config_file, every, prometheus, rounds)


cli.add_command(explain)


def run(argv: list[str]) -> int:
    """Run ``argv``; return the exit code. Errors are one line on stderr, with no URL's
    credentials or secret query values in it."""
    try:
        cli.main(args=argv, prog_name="llm-latency", standalone_mode=False)
    except CLIError as exc:
        message = str(exc)
        sys.stderr.write(
            scrub(message if getattr(exc, "raw", False) else f"llm-latency: error: {message}")
            + "\n"
        )
        return exc.exit_code
    except click.UsageError as exc:
        sys.stderr.write(scrub(f"llm-latency: error: {exc.format_message()}") + "\n")
        return 2
    except click.ClickException as exc:
        sys.stderr.write(scrub(f"llm-latency: error: {exc.format_message()}") + "\n")
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        sys.stderr.write("llm-latency: interrupted\n")
        return 130
    except (BrokenPipeError, OutputGone):
        _drop_stdout()
        return BROKEN_PIPE_EXIT
    except Exception as exc:
        if os.environ.get("LLM_LATENCY_DEBUG"):
            raise
        sys.stderr.write(scrub(f"llm-latency: error: {type(exc).__name__}: {exc}") + "\n")
        return 1
    return 0


def _drop_stdout() -> None:
    """The reader of stdout went away: send what is left (and the interpreter's final flush)
    to /dev/null, so that no second BrokenPipeError is reported at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
