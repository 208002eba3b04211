"""``OTEL_TRACES_EXPORTER=llm_latency_console``: a program run for real with that variable
prints each finished call as a tree (attempts, backoff, phases, request ids) and its findings;
in process, a call split over many export batches is printed once, when it is over."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

from llm_latency import console_exporter
from llm_latency.console_exporter import LLMLatencyConsoleSpanExporter
from tests.checks import refused_once
from tests.command_line import mock_server
from tests.conftest import Telemetry
from tests.provider_api import ProviderServer, provider_server
from tests.servers import LLMServer

#: instrument(), two chat completions with the openai SDK, and a line of its own.
APP = Path(__file__).parent / "programs" / "openai_calls.py"
REQUEST_ID = r"req_[0-9a-f]{24}"
MS = r"[\d.]+ (?:µs|ms)"


def run_app(
    base_url: str, *prefix: str, app: Path = APP, **env: str
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environment.pop("COLUMNS", None)  # written to a pipe: lines are not broken
    environment.update(OTEL_TRACES_EXPORTER="llm_latency_console", OTEL_METRICS_EXPORTER="none")
    environment.update(env)
    return subprocess.run(
        [*prefix, sys.executable, str(app), base_url],
        capture_output=True, text=True, env=environment, timeout=60, check=False,
    )  # fmt: skip


#: What an answer adds to its attempt's line: the server's token counts (the mock's one-token
#: answer); no bound on its time per token, which for one token is the server's whole time.
ANSWERED = r" input_tokens=\d+ output_tokens=1"


def blocks(text: str) -> list[list[str]]:
    """The printed calls: blocks of lines that start with a call's tree."""
    return [block.splitlines() for block in text.strip().split("\n\n") if block.strip()]


def check_rate_limited_run(result: subprocess.CompletedProcess[str], call_name: str) -> None:
    """Two calls: a 200; then a 429 (retry-after-ms 250), a backoff and a 200."""
    assert result.returncode == 0, result.stderr
    assert result.stdout == "the program's own output\n"  # the trees go to stderr
    assert "sk-never-printed" not in result.stderr
    first, second, found = blocks(result.stderr)
    assert re.fullmatch(rf"{call_name} +0 µs \+ +{MS}  attempts=1", first[0]), first[0]
    assert re.fullmatch(
        rf"  POST /v1/chat/completions +{MS} \+ +{MS}  status_code=200 connection=new "
        rf"request_id={REQUEST_ID} server={MS}{ANSWERED}",
        first[1],
    ), first[1]
    assert [line.split()[0] for line in first[2:6]] == [
        "http.connect", "http.send", "http.wait", "http.receive"
    ]  # fmt: skip
    assert len(first) == 6  # no findings after each call: those of the calls come after them

    assert re.fullmatch(rf"{call_name} +0 µs \+ +{MS}  attempts=2 backoff={MS}", second[0])
    assert re.fullmatch(
        rf"  POST /v1/chat/completions +{MS} \+ +{MS}  status_code=429 connection=pooled "
        rf"request_id={REQUEST_ID} retry-after-ms=250 server={MS}",
        second[1],
    ), second[1]
    assert [line.split()[0] for line in second[2:5]] == ["http.send", "http.wait", "http.receive"]
    backoff = re.fullmatch(
        rf"  retry\.backoff +{MS} \+ +([\d.]+) ms  reason=429 retry_after=250 ms",
        second[5],
    )
    assert backoff is not None, second[5]
    assert float(backoff.group(1)) >= 250 - 1
    assert re.fullmatch(
        rf"  POST /v1/chat/completions +{MS} \+ +{MS}  status_code=200 resend_count=1 "
        rf"connection=pooled request_id={REQUEST_ID} server={MS}{ANSWERED}",
        second[6],
    ), second[6]
    assert [line.split()[0] for line in second[7:10]] == ["http.send", "http.wait", "http.receive"]
    # The rate-limits finding, in the form the wait as measured calls for (refused_once).
    assert len(second) == 10
    # Over both calls' three attempts (refused_once's forms are of one call's two).
    forms = {
        form.replace("1 of 2 attempts", "1 of 3 attempts")
        for form in refused_once(0.25, float(backoff.group(1)) / 1e3)
    }
    assert found[0] == "llm-latency: findings over the last 2 calls:"
    assert any(line.startswith(tuple(forms)) for line in found[1:]), (forms, found)
    ids = re.findall(REQUEST_ID, "\n".join(first + second))
    assert len(ids) == len(set(ids)) == 3  # each attempt's own


def test_the_variable_prints_each_call_of_a_real_program() -> None:
    """llm_latency.instrument() sets the SDK up from OTEL_*, and honours the entry point."""
    with mock_server("--rate-limit-every", "2", "--ttfb", "0.05", "--tokens", "1") as mock:
        result = run_app(mock.url.removesuffix("/chat/completions"))
    check_rate_limited_run(result, "openai chat.completions")


def seconds(text: str) -> float:
    number, unit = text.split()
    return float(number) * {"µs": 1e-6, "ms": 1e-3}[unit]


def test_the_bound_on_the_time_per_token_says_what_it_is() -> None:
    """Answers not streamed, 5 tokens at 50 tokens/s (20 ms each) after 0.1 s: the server's time
    over the output tokens is an upper bound of the time per token (the time to the first token
    is in it: about 36 ms here). The tree says so, and how it is computed from the facts beside
    it, never as a time per token of its own name (per_token_max, read as the pace, was
    3 times it)."""
    with mock_server("--ttfb", "0.1", "--tokens", "5", "--tokens-per-second", "50") as mock:
        result = run_app(mock.url.removesuffix("/chat/completions"))
    assert result.returncode == 0, result.stderr
    assert "per_token_max" not in result.stderr
    answers = re.findall(
        rf"server=({MS}) input_tokens=\d+ output_tokens=5 per_token≤({MS}) "
        r"\(server/output_tokens\)$",
        result.stderr,
        re.MULTILINE,
    )
    assert len(answers) == 2, result.stderr
    for server, bound in answers:
        assert seconds(bound) == pytest.approx(seconds(server) / 5, rel=0.01)


def test_the_variable_under_opentelemetry_instrument() -> None:
    """The SDK's own configurator (opentelemetry-instrument) finds the exporter by name too;
    with the openai-v2 instrumentation, its GenAI span is each call's parent, and under the
    httpx2 instrumentation's CLIENT span of each request, llm-latency's (INTERNAL) request span
    is still read as the attempt."""
    instrument = str(Path(sys.executable).with_name("opentelemetry-instrument"))
    with mock_server("--rate-limit-every", "2", "--ttfb", "0.05", "--tokens", "1") as mock:
        result = run_app(
            mock.url.removesuffix("/chat/completions"), instrument,
            OTEL_LOGS_EXPORTER="none",
        )  # fmt: skip
    check_rate_limited_run(result, "chat gpt-test")


@pytest.mark.parametrize("columns", [60, 80, 100])
def test_the_trees_fit_columns(columns: int) -> None:
    """Under ``COLUMNS``, no line is wider: facts continue on lines of their own, findings wrap
    at spaces, never between a number and its unit; the facts are all still there."""
    with mock_server("--rate-limit-every", "2", "--ttfb", "0.05", "--tokens", "1") as mock:
        result = run_app(mock.url.removesuffix("/chat/completions"), COLUMNS=str(columns))
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert max(len(line) for line in lines) <= columns, result.stderr
    words = result.stderr.split()
    assert "resend_count=1" in words and "reason=429" in words
    assert len(re.findall(REQUEST_ID, result.stderr)) == 3
    assert not re.search(
        r"\d$", "\n".join(line for line in lines if re.search(r"^\s*(?:µs|ms|s)\b", line))
    )
    for number, line in enumerate(lines[1:], 1):  # a unit never starts a continuation line
        assert not re.match(r"\s*(?:µs|ms|s)\b", line), (lines[number - 1], line)


def test_opentelemetry_instrument_without_a_distro_says_why_there_are_no_spans() -> None:
    """No distro, no configurator: nothing sets the SDK up, and one line says what to do."""
    instrument = str(Path(sys.executable).with_name("opentelemetry-instrument"))
    with mock_server("--ttfb", "0.05", "--tokens", "1") as mock:
        result = run_app(
            mock.url.removesuffix("/chat/completions"), instrument,
            OTEL_PYTHON_DISTRO="none", OTEL_PYTHON_CONFIGURATOR="none",
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("llm-latency: no OpenTelemetry SDK was set up") == 1, result.stderr
    assert "pip install opentelemetry-distro" in result.stderr
    assert "POST /v1/chat/completions" not in result.stderr  # indeed no spans


# -- in process: batches, parents, the memory bound, shutdown ----------------------------------


@pytest.fixture(autouse=True)
def no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process exporters write to a StringIO: lines unbroken unless COLUMNS says."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture
async def provider() -> AsyncIterator[ProviderServer]:
    async with provider_server() as server:
        yield server


def attach(telemetry: Telemetry, batched: bool = False) -> io.StringIO:
    """A console exporter on the test's provider, behind a processor; what it prints."""
    out = io.StringIO()
    exporter = LLMLatencyConsoleSpanExporter(out)
    processor = (
        BatchSpanProcessor(exporter, max_export_batch_size=2, schedule_delay_millis=10)
        if batched
        else SimpleSpanProcessor(exporter)
    )
    telemetry.tracer_provider.add_span_processor(processor)
    return out


@pytest.mark.parametrize("batched", [False, True], ids=["one-span-exports", "batches-of-two"])
async def test_a_call_split_over_exports_is_printed_once(
    telemetry: Telemetry, provider: ProviderServer, batched: bool
) -> None:
    out = attach(telemetry, batched)
    client = openai.AsyncOpenAI(base_url=provider.openai_base, api_key="sk-test-key")
    await client.chat.completions.create(
        model="gpt-test",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-test-scenario": "split", "x-test-fail": "1"},
    )
    await client.close()
    telemetry.tracer_provider.force_flush()
    block, found = blocks(out.getvalue())
    assert [re.split(r"\s{2,}", line.strip())[0] for line in block] == [
        "openai chat.completions",
        "POST /v1/chat/completions", "http.connect", "http.send", "http.wait", "http.receive",
        "retry.backoff",
        "POST /v1/chat/completions", "http.send", "http.wait", "http.receive",
    ]  # fmt: skip
    assert "request_id=req_429" in block[1] and "request_id=req_openai_1" in block[7]
    assert found[0] == "llm-latency: findings over the last call:"
    assert found[1].startswith("→ 1 of 2 attempts were rate limited")


async def test_calls_under_a_program_span_wait_for_it(
    telemetry: Telemetry, server: LLMServer
) -> None:
    out = attach(telemetry)
    tracer = telemetry.tracer_provider.get_tracer("app")
    async with aiohttp.ClientSession() as session:
        with tracer.start_as_current_span("nightly job"):
            for _ in range(2):
                async with session.get(server.url()) as response:
                    await response.read()
            assert out.getvalue() == ""  # the job may still make more attempts of its calls
        job = blocks(out.getvalue())
        async with session.get(server.url()) as response:  # no parent: printed at once
            await response.read()
    alone = blocks(out.getvalue())[len(job) :]
    assert [block[0].split()[:2] for block in job] == [["nightly", "job"]] * 2
    assert [line.split()[0] for line in job[0][1:5]] == [
        "GET",
        "http.connect",
        "http.send",
        "http.wait",
    ]
    assert "connection=pooled" in job[1][1] and "request_id=req_test_123" in job[1][1]
    (single,) = alone
    assert single[0].split()[0] == "GET" and "attempts=1" in single[0]


async def test_the_memory_bound_prints_the_oldest_trace(
    telemetry: Telemetry, server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(console_exporter, "MAX_BUFFERED_SPANS", 4)
    out = attach(telemetry)
    tracer = telemetry.tracer_provider.get_tracer("app")
    async with aiohttp.ClientSession() as session:
        with tracer.start_as_current_span("endless job"):
            async with session.get(server.url()) as response:
                await response.read()
            (early,) = blocks(out.getvalue())  # five spans held: more than four
    assert early[0].split()[0] == "GET" and "attempts=1" in early[0]  # its parent never came
    assert len(blocks(out.getvalue())) == 1  # the job ended with nothing left to print


async def test_shutdown_prints_what_is_held(telemetry: Telemetry, server: LLMServer) -> None:
    out = io.StringIO()
    exporter = LLMLatencyConsoleSpanExporter(out)
    processor = SimpleSpanProcessor(exporter)
    telemetry.tracer_provider.add_span_processor(processor)
    tracer = telemetry.tracer_provider.get_tracer("app")
    with tracer.start_as_current_span("still running") as job:
        async with aiohttp.ClientSession() as session, session.get(server.url()) as response:
            await response.read()
        assert out.getvalue() == ""
        processor.shutdown()
        block, (at_exit,) = blocks(out.getvalue())
        assert block[0].split()[0] == "GET" and block[1].split()[0] == "GET"
        assert at_exit == "llm-latency: no findings over the last call, at exit"
    assert not job.is_recording()
    assert len(blocks(out.getvalue())) == 2  # nothing after the shutdown


# -- findings across calls -----------------------------------------------------------------------

#: 30 requests at once through an aiohttp pool of 5 per host (tests/programs/pool_burst.py).
BURST = Path(__file__).parent / "programs" / "pool_burst.py"
POOL_QUEUE = re.compile(r"→ (\d+) requests waited for a free connection: (\d+) were in flight")


def test_a_burst_through_a_small_pool_is_diagnosed_across_its_calls() -> None:
    """The seed's aiohttp program under the console exporter: 30 requests at once, a pool of 5
    per host, a server that answers in 300 ms, so 25 requests wait for a connection. Each call
    alone shows a wait, none why: the findings come from the calls of the window, once when
    they appear (not after each call), and at exit with what all 30 show."""
    with mock_server("--ttfb", "0.3", "--tokens", "1") as mock:
        result = run_app(mock.url, app=BURST)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "the program's own output\n"
    assert "no findings" not in result.stderr
    calls = re.findall(r"^POST .* attempts=1$", result.stderr, re.MULTILINE)
    assert len(calls) == 30, result.stderr
    found = POOL_QUEUE.findall(result.stderr)
    assert 1 <= len(found) <= 2, result.stderr  # when it appears, and at exit if it grew
    assert found[-1] == ("25", "30"), result.stderr  # at the end, over all 30 calls
    lines = result.stderr.splitlines()
    last = max(i for i, line in enumerate(lines) if POOL_QUEUE.match(line))
    assert "aiohttp.TCPConnector(limit=30, limit_per_host=30)" in " ".join(lines[last:])
    assert len(re.findall(r"^→ ", result.stderr, re.MULTILINE)) < 10  # never one per call
