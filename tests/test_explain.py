"""``llm-latency explain FILE`` on trace files made from real exported spans: the openai SDK
against a loopback server (a 429, then a 200), and fresh connections through a slow DNS server,
written as Jaeger's JSON and as OTLP JSON; real samples of Jaeger's JSON; every bad file."""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from opentelemetry.sdk.trace import ReadableSpan

from llm_latency import trace_files
from llm_latency.diagnosis import calls_from_spans, from_readable_spans
from llm_latency.diagnosis.records import Call
from llm_latency.testing import LocalDNS, Profile, running
from tests.checks import REFUSED_ONCE, WAITED_TOO_LONG, refused_once
from tests.command_line import run_cli
from tests.conftest import Telemetry
from tests.provider_api import ProviderServer, provider_server
from tests.servers import LLMServer
from tests.trace_formats import jaeger_json, otlp_json_lines

DATA = Path(__file__).parent / "data"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
FORMATS = ["jaeger", "otlp"]


@pytest.fixture(autouse=True)
def no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """explain's lines are unbroken unless COLUMNS (or a terminal) says (see
    test_explain_fits_columns)."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture
async def provider() -> AsyncIterator[ProviderServer]:
    async with provider_server() as server:
        yield server


async def rate_limited_call(telemetry: Telemetry, provider: ProviderServer) -> list[ReadableSpan]:
    """One openai call: a 429 with retry-after-ms 150, then a 200 (the SDK retries)."""
    client = openai.AsyncOpenAI(base_url=provider.openai_base, api_key="sk-test-key")
    await client.chat.completions.create(
        model="gpt-test",
        messages=MESSAGES,
        extra_headers={"x-test-scenario": "explain", "x-test-fail": "1"},
    )
    await client.close()
    return telemetry.spans()


async def fresh_connections(
    telemetry: Telemetry, server: LLMServer, dns: LocalDNS
) -> list[ReadableSpan]:
    """Four requests in one program span, each on a new session: DNS (30 ms) and TCP each time."""
    dns.resolver.delay = 0.03
    tracer = telemetry.tracer_provider.get_tracer("app")
    with tracer.start_as_current_span("batch job"):
        for _ in range(4):
            resolver = aiohttp.AsyncResolver(nameservers=[dns.nameserver])
            connector = aiohttp.TCPConnector(resolver=resolver)
            async with aiohttp.ClientSession(connector=connector) as session:
                url = server.url(host="api.llm.test", wait=0.01)
                async with session.post(url, json={"model": "m"}) as response:
                    await response.read()
    return telemetry.spans()


def write(tmp_path: Path, spans: Sequence[ReadableSpan], fmt: str) -> Path:
    """The spans as a Jaeger download, or as a file exporter's file (two export batches)."""
    if fmt == "jaeger":
        path = tmp_path / "trace.json"
        path.write_text(jaeger_json(spans))
    else:
        path = tmp_path / "traces.jsonl"
        half = len(spans) // 2
        path.write_text(otlp_json_lines([spans[:half], spans[half:]]))
    return path


def explain(*args: str, stdin: str | None = None) -> str:
    result = run_cli("explain", *args, stdin=stdin)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def rows(output: str) -> list[tuple[str, float, float, str]]:
    """The tree lines: (name with its indent, start s, duration s, facts)."""
    units = {"µs": 1e-6, "ms": 1e-3, "s": 1.0}
    found = []
    pattern = r"(\s*\S.*?)\s+([\d.]+) (µs|ms|s) \+\s+([\d.]+) (µs|ms|s)\s*(.*)"
    for line in output.splitlines():
        match = re.fullmatch(pattern, line)
        if match:
            name, start, su, length, lu, facts = match.groups()
            found.append((name, float(start) * units[su], float(length) * units[lu], facts))
    return found


def same_calls(read: Sequence[Call], spans: Sequence[ReadableSpan], tolerance_ns: int) -> None:
    """What the file gives back is what the spans said, to the file's time resolution."""
    expected = calls_from_spans(from_readable_spans(spans))
    assert [c.name for c in read] == [c.name for c in expected]
    for got, want in zip(read, expected, strict=True):
        assert abs(got.start_ns - want.start_ns) <= tolerance_ns
        assert len(got.backoffs) == len(want.backoffs)
        for got_backoff, want_backoff in zip(got.backoffs, want.backoffs, strict=True):
            assert got_backoff.reason == want_backoff.reason
            assert got_backoff.retry_after == want_backoff.retry_after
            assert got_backoff.duration == pytest.approx(want_backoff.duration, abs=2e-6)
        for got_attempt, want_attempt in zip(got.attempts, want.attempts, strict=True):
            for field in ("status", "request_id", "reused", "resend_count", "ratelimit",
                          "server_processing", "url", "method", "span_id", "trace_id"):  # fmt: skip
                assert getattr(got_attempt, field) == getattr(want_attempt, field), field
            assert [p.name for p in got_attempt.phases] == [p.name for p in want_attempt.phases]
            for got_phase, want_phase in zip(got_attempt.phases, want_attempt.phases, strict=True):
                assert got_phase.start == pytest.approx(want_phase.start, abs=2e-6)
                assert got_phase.duration == pytest.approx(want_phase.duration, abs=2e-6)


# -- real runs, written as each tool writes them ------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
async def test_explain_a_rate_limited_openai_call(
    telemetry: Telemetry, provider: ProviderServer, tmp_path: Path, fmt: str
) -> None:
    spans = await rate_limited_call(telemetry, provider)
    path = write(tmp_path, spans, fmt)
    (trace,) = trace_files.load(path.read_text(), str(path))
    same_calls(trace.calls, spans, tolerance_ns=1000 if fmt == "jaeger" else 0)

    output = explain(str(path))
    trace_id = f"{spans[0].context.trace_id:032x}"
    assert output.startswith(f"trace {trace_id}: 1 call\n")
    names = [(name, facts) for name, _, _, facts in rows(output)]
    assert [name for name, _ in names] == [
        "openai chat.completions",
        "  POST /v1/chat/completions",
        "    http.connect",
        "    http.send",
        "    http.wait",
        "    http.receive",
        "  retry.backoff",
        "  POST /v1/chat/completions",
        "    http.send",
        "    http.wait",
        "    http.receive",
    ]
    assert re.fullmatch(r"attempts=2 backoff=\d+ ms", names[0][1])
    assert names[1][1] == "status_code=429 connection=new request_id=req_429 retry-after-ms=150"
    assert names[6][1] == "reason=429 retry_after=150 ms"
    assert names[7][1].startswith(
        "status_code=200 resend_count=1 connection=pooled request_id=req_openai_1 server="
    )
    table = rows(output)
    _, call_start, call_length, _ = table[0]
    _, backoff_start, backoff_length, _ = table[6]
    _, second_start, second_length, _ = table[7]
    assert call_start == 0.0
    assert backoff_length >= 0.15 - 0.001  # the SDK waited as the server asked
    assert backoff_start < second_start  # in order, and inside the call
    assert second_start + second_length <= call_length * 1.01 + 0.001
    # The rate-limits finding, in the form the wait as measured calls for (refused_once).
    forms = refused_once(0.15, backoff_length)
    assert any(form in output for form in forms), (forms, output)
    if forms == {REFUSED_ONCE}:
        assert "  fix: limit the request rate on the client side" in output
    elif forms == {WAITED_TOO_LONG}:
        assert "  fix: honour retry-after" in output


@pytest.mark.parametrize("fmt", FORMATS)
async def test_explain_fresh_connections_finds_them(
    telemetry: Telemetry, server: LLMServer, dns: LocalDNS, tmp_path: Path, fmt: str
) -> None:
    spans = await fresh_connections(telemetry, server, dns)
    path = write(tmp_path, spans, fmt)
    (trace,) = trace_files.load(path.read_text(), str(path))
    same_calls(trace.calls, spans, tolerance_ns=1000 if fmt == "jaeger" else 0)

    output = explain(str(path))
    assert output.splitlines()[0].endswith(": 4 calls")
    table = rows(output)
    assert [name for name, *_ in table].count("batch job") == 4
    dns_rows = [length for name, _, length, _ in table if name == "    http.dns"]
    assert len(dns_rows) == 4 and min(dns_rows) >= 0.03 - 0.001
    assert [facts for name, *_, facts in table if name.startswith("  POST")] == [
        "status_code=200 connection=new request_id=req_test_123 server=10.0 ms"
    ] * 4
    assert "→ 3 of 3 requests that could have used a pooled connection opened a new one" in output
    assert "  fix: reuse one client for all requests: one aiohttp.ClientSession()" in output
    starts = [start for name, start, *_ in table if name == "batch job"]
    assert starts == sorted(starts) and starts[0] == 0.0  # offsets from the trace's first call


async def test_explain_reads_standard_input_and_several_traces(
    telemetry: Telemetry, provider: ProviderServer
) -> None:
    client = openai.AsyncOpenAI(base_url=provider.openai_base, api_key="sk-test-key")
    for _ in range(2):  # two calls, no program span: two traces
        await client.chat.completions.create(model="gpt-test", messages=MESSAGES)
    await client.close()
    spans = telemetry.spans()
    output = explain("-", stdin=otlp_json_lines([spans]))
    headers = [line for line in output.splitlines() if line.startswith("trace ")]
    trace_ids = {f"{s.context.trace_id:032x}" for s in spans}
    assert len(headers) == 2 and {h.split()[1].rstrip(":") for h in headers} == trace_ids
    *trees, findings = output.split("\n\n")  # each trace's tree, then the file's findings
    assert len(trees) == 2
    for block in trees:
        assert block.count("attempts=1") == 1
        assert len(block.splitlines()) == 1 + len(rows(block))  # no findings of its own
    lines = findings.splitlines()
    assert lines[0] == "findings: 2 calls in 2 traces, diagnosed together"
    evidence = [line for line in lines if line.startswith("→ ") and "requests)" in line]
    assert all(line.endswith(" of 2 requests)") for line in evidence)  # both traces' calls


async def test_explain_diagnoses_a_file_s_calls_together(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    """A program with no span of its own, a new session per call: each call is a trace of its
    own, one call is no evidence, but the four are: the file's calls are diagnosed together,
    as ``diagnose()`` reads the program's spans."""
    async with running(Profile(ttfb=0.01, tokens=1, tls_delay=0.03), tls=True) as server:
        context = ssl.create_default_context(cafile=str(server.ca_file))
        for _ in range(4):
            async with aiohttp.ClientSession() as session:
                async with session.post(server.url(), json={}, ssl=context) as response:
                    await response.read()
    path = write(tmp_path, telemetry.spans(), "otlp")
    output = explain(str(path))
    assert len([line for line in output.splitlines() if line.startswith("trace ")]) == 4
    assert "→ no findings" not in output
    findings = output.split("\n\n")[-1]
    assert findings.startswith("findings: 4 calls in 4 traces, diagnosed together\n")
    assert "→ 3 of 3 requests that could have used a pooled connection opened a new one" in findings
    assert "one aiohttp.ClientSession() for the program's life" in findings


async def test_explain_diagnoses_each_program_apart(
    telemetry: Telemetry, server: LLMServer, dns: LocalDNS, tmp_path: Path
) -> None:
    """Two programs' traces in one file (Jaeger's ``processes``): each program's calls are
    diagnosed on their own, under its name."""
    spans = await fresh_connections(telemetry, server, dns)
    documents = [json.loads(jaeger_json(spans, service=name)) for name in ("batch", "other")]
    documents[1]["data"][0]["traceID"] = "f" * 32
    for span in documents[1]["data"][0]["spans"]:  # the same spans, in a trace of their own
        span["traceID"] = "f" * 32
        for reference in span["references"]:
            reference["traceID"] = "f" * 32
    path = tmp_path / "two.json"
    path.write_text(json.dumps({"data": documents[0]["data"] + documents[1]["data"]}))
    output = explain(str(path))
    blocks = output.split("\n\n")
    assert [b.splitlines()[0] for b in blocks[2:]] == [
        "findings for batch: 4 calls in 1 trace, diagnosed together",
        "findings for other: 4 calls in 1 trace, diagnosed together",
    ]
    for block in blocks[2:]:  # each sees its own four calls, not eight
        assert "→ 3 of 3 requests that could have used a pooled connection" in block


async def test_otlp_json_with_base64_ids_and_enum_names(
    telemetry: Telemetry, provider: ProviderServer
) -> None:
    """A generic protobuf JSON writer's form (base64 ids, "SPAN_KIND_CLIENT") reads the same."""
    spans = await rate_limited_call(telemetry, provider)
    text = otlp_json_lines([spans], hex_ids=False)
    assert '"SPAN_KIND_CLIENT"' in text
    (trace,) = trace_files.load(text)
    same_calls(trace.calls, spans, tolerance_ns=0)


# -- Jaeger's own JSON ------------------------------------------------------------------------


def test_jaeger_samples_parse() -> None:
    """Real files of Jaeger's (tests/data/README.md): ids, times, references, typed tags."""
    answer = trace_files.parse(
        (DATA / "jaeger-ui-2992f2a5b5d037a8aabffd08ef384237.json").read_text()
    )
    assert answer.format == trace_files.JAEGER
    thread, demo = answer.spans
    assert (thread.name, demo.name) == ("thread", "demo")
    assert thread.parent_id is None  # FOLLOWS_FROM is a link, not a parent
    assert demo.start_ns == 1509533706470949000 and demo.end_ns == demo.start_ns + 70406000
    assert thread.trace_id == "2992f2a5b5d037a8aabffd08ef384237"

    trace = trace_files.parse((DATA / "jaeger-converter-ui_01.json").read_text())
    assert [s.span_id[-1] for s in trace.spans] == ["2", "2", "3", "4", "5"]
    tags = trace.spans[1].attributes
    assert tags == {"peer.service": "service-y", "peer.ipv4": 23456, "error": True,
                    "temperature": 72.5, "javascript_limit": 9223372036854775222,
                    "blob": "AAAwOQ=="}  # fmt: skip
    assert [s.parent_id for s in trace.spans[2:]] == [
        "0000000000000002",
        "0000000000000002",  # the CHILD_OF in the same trace, not the one to another trace
        "0000000000000004",
    ]
    assert all(s.kind == "INTERNAL" and s.scope is None for s in trace.spans)


def test_jaeger_array_attributes_come_back_as_arrays() -> None:
    """The OTLP to Jaeger translation writes a string[] attribute as its JSON in a string tag."""
    document = {"traceID": "1" * 32, "spans": [{
        "traceID": "1" * 32, "spanID": "2" * 16, "operationName": "POST /v1/chat/completions",
        "references": [], "startTime": 1, "duration": 2, "processID": "p1", "tags": [
            {"key": "otel.scope.name", "type": "string", "value": "llm_latency"},
            {"key": "span.kind", "type": "string", "value": "client"},
            {"key": "http.response.header.x-request-id", "type": "string", "value": '["req_1"]'},
            {"key": "note", "type": "string", "value": "[not json"},
        ]}]}  # fmt: skip
    (span,) = trace_files.parse(json.dumps(document)).spans
    assert span.attributes == {"http.response.header.x-request-id": ("req_1",), "note": "[not json"}
    assert (span.kind, span.scope) == ("CLIENT", "llm_latency")


# -- bad files: one line each, exit 1 ---------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "{path} is empty"),
        ("  \n", "{path} is empty"),
        ("{not json", "{path} is not JSON (line 1: Expecting property name enclosed in double quotes)"),
        ('{"resourceSpans": []}\n{"resourceSpans": [\n', "{path} is not JSON (line 2: Expecting value)"),
        ('{"spans": 3}', "{path} is JSON, but neither Jaeger's trace JSON ({{\"data\": [...]}}) nor OTLP JSON ({{\"resourceSpans\": [...]}})"),
        ("[1, 2]", "{path} is JSON, but neither Jaeger's trace JSON ({{\"data\": [...]}}) nor OTLP JSON ({{\"resourceSpans\": [...]}})"),
        ('{"resourceSpans": []}', "{path} holds no spans (OTLP JSON)"),
        ('{"data": []}', "{path} holds no spans (Jaeger JSON)"),
        ('{"data": null, "total": 0, "limit": 0, "offset": 0, "errors": [{"code": 404, "msg": "trace not found"}]}',
         "{path} is Jaeger's answer with no trace but an error: 404 trace not found"),
        ('{"data": [{"spans": [{"traceID": "xyz", "spanID": "1", "startTime": 1}]}]}',
         "{path}: a Jaeger span without valid ids or times (ValueError: invalid literal for int() with base 16: 'xyz')"),
        ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "00", "spanId": "", "startTimeUnixNano": "1"}]}]}]}',
         "{path}: an OTLP span without valid ids or times (id '00')"),
    ],
)  # fmt: skip
def test_bad_files_are_one_error_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    result = run_cli("explain", str(path))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == f"llm-latency: error: {message.format(path=path)}\n"


def test_files_without_llm_latency_spans_and_unreadable_files(tmp_path: Path) -> None:
    sample = DATA / "jaeger-ui-2992f2a5b5d037a8aabffd08ef384237.json"
    binary = tmp_path / "trace.bin"
    binary.write_bytes(b"\xff\xfe\x00binary")
    cases = {
        str(sample): f"{sample} holds 2 spans (Jaeger JSON), none of them an llm-latency request "
        "span: was the program instrumented with llm_latency.instrument()?",
        str(tmp_path / "missing.json"): f"cannot read {tmp_path / 'missing.json'}: No such file "
        "or directory",
        str(tmp_path): f"cannot read {tmp_path}: Is a directory",
        str(binary): f"{binary} is not JSON (not UTF-8 text)",
    }
    for argument, message in cases.items():
        result = run_cli("explain", argument)
        assert result.returncode == 1
        assert (result.stdout, result.stderr) == ("", f"llm-latency: error: {message}\n")


async def test_explain_fits_columns(
    telemetry: Telemetry, provider: ProviderServer, tmp_path: Path
) -> None:
    """Under ``COLUMNS``, explain's trees and findings fit it, as the console exporter's do."""
    path = tmp_path / "trace.jsonl"
    path.write_text(otlp_json_lines([await rate_limited_call(telemetry, provider)]))
    result = run_cli("explain", str(path), env={"COLUMNS": "72"})
    assert result.returncode == 0, result.stderr
    assert max(len(line) for line in result.stdout.splitlines()) <= 72
    assert "retry-after-ms=150" in result.stdout.split()
