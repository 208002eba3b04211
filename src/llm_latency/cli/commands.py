"""The click commands behind ``llm-latency``, and :func:`run`, which turns every error into
one line on stderr and an exit code. ``probe`` is in ``probe_command``, ``explain`` in
``explain``."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import click

from llm_latency.cli.errors import CLIError, OutputGone
from llm_latency.cli.explain import explain
from llm_latency.cli.probe_command import probe
from llm_latency.cli.redaction import scrub
from llm_latency.cli.render import make_console
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


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=9466, show_default=True)
@click.option(
    "--window",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    help="Seconds of calls each (service, host) window keeps.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=15.0,
    show_default=True,
    help="Seconds between two diagnoses.",
)
@click.option(
    "--calls-per-window",
    type=click.IntRange(min=1),
    default=2000,
    show_default=True,
    help="The newest calls each window keeps at most.",
)
@click.option(
    "--max-windows",
    type=click.IntRange(min=1),
    default=50,
    show_default=True,
    help="(service, host) windows kept at most; the one idle longest goes first.",
)
@click.option(
    "--settle",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="Seconds without a new span before a trace's calls are read.",
)
@click.option(
    "--external-url",
    metavar="URL",
    help="Where readers reach the findings page (the alert links there). Default: the "
    "address it listens on.",
)
@click.option(
    "--grpc-port",
    type=click.IntRange(0, 65535),
    help="Also receive OTLP/gRPC on this port (the Collector's otlp_grpc and loadbalancing "
    "exporters; needs the grpc extra).",
)
def advise(
    host: str,
    port: int,
    window: float,
    interval: float,
    calls_per_window: int,
    max_windows: int,
    settle: float,
    external_url: str | None,
    grpc_port: int | None,
) -> None:
    """The findings service: diagnose a service's LLM calls continuously (Ctrl-C to stop).

    \b
    It receives spans over OTLP/HTTP (protobuf or JSON) at /v1/traces, and over OTLP/gRPC
    with --grpc-port: the Collector sends it a copy before sampling. Every interval it
    diagnoses the calls of each service and provider host, and serves what it found:
      /metrics         for Prometheus: the saving of each finding's fix, per service,
                       host and rule (llm_latency_advice_*)
      /                the findings, their fixes and savings (?service=NAME&host=HOST)
      /findings.json   the same as JSON
    """
    from llm_latency.advise import Settings
    from llm_latency.cli.advise_command import run_advise

    settings = Settings(
        window=window,
        interval=interval,
        per_key=calls_per_window,
        max_keys=max_windows,
        settle=settle,
    )
    run_advise(host, port, settings, external_url, grpc_port)


cli.add_command(probe)
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
