"""Fuzzing what servers send: header values of any shape never make llm-latency raise or leak a
header that is not allow-listed, and odd status lines and header blocks sent by a raw socket
leave aiohttp's and httpx2's behaviour exactly as it is without the plugin. Also: whatever
wait a 429 asks for, ``llm_latency.retry`` re-raises the 429 rather than an error of its own.

(SSE chunk boundaries are fuzzed in ``test_sse.py``.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import email.utils
import json
import logging
import math
import os
import threading
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx2
import pytest
import requests
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.util.http import OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_RESPONSE

import llm_latency
from llm_latency import headers as hdr
from llm_latency.calls import LogicalCall, current_call
from llm_latency.emitter import Emitter
from llm_latency.settings import Settings, resolve
from llm_latency.timeline import CONNECT, PHASE_NAMES, RECEIVE, SEND, WAIT, Timeline
from tests.attributes import attributes
from tests.bad_servers import RawServer
from tests.checks import compare
from tests.conftest import OpenSpans, Telemetry
from tests.httpx_clients import Client

#: A value no strategy below produces by chance: put on credential headers, it must never be
#: exported.
SECRET = "s3cr3t-7b1e0c55"

# -- what llm-latency logs when something inside it failed --------------------------------------


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def internal_errors() -> Iterator[_Errors]:
    """ERROR records of the ``llm_latency`` loggers ("failed to emit", "internal error")."""
    handler = _Errors()
    logger = logging.getLogger("llm_latency")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def assert_no_internal_error(errors: _Errors) -> None:
    messages = [record.getMessage() for record in errors.records]
    errors.records.clear()
    assert messages == []


# -- strategies: header names and values -------------------------------------------------------

KNOWN_NAMES = sorted(
    {*hdr.DEFAULT_RESPONSE_HEADERS, *hdr.SENSITIVE_HEADERS, "content-type", "x-custom-id"}
)
ODD_CHARACTERS = ["\x00", "\r", "\n", "\t", "\x7f", "\x85", "\xa0", "\u2028", "\ufeff",
                  "\ud800", "\U0001f600", "K"]  # fmt: skip
ANY_CHARACTER = st.one_of(st.characters(exclude_categories=()), st.sampled_from(ODD_CHARACTERS))


@st.composite
def cased(draw: st.DrawFn, names: list[str]) -> str:
    """A known name with random letter case and, sometimes, surrounding blanks."""
    name = draw(st.sampled_from(names))
    flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    name = "".join(c.upper() if flip else c for c, flip in zip(name, flips, strict=True))
    return draw(st.sampled_from(["", " ", "\t"])) + name + draw(st.sampled_from(["", " ", "\t"]))


NAME_TEXT = st.one_of(cased(KNOWN_NAMES), st.text(ANY_CHARACTER, max_size=30))
HEADER_NAMES = st.one_of(
    NAME_TEXT,
    NAME_TEXT.map(lambda s: s.encode("utf-8", "surrogatepass")),
    cased(KNOWN_NAMES).map(lambda s: s.strip().encode("latin-1")),
    st.binary(max_size=30),
)
ODD_NUMBERS = ["nan", "NaN", "inf", "-inf", "1e309", "-1e309", "-0", "1_000", " 12 ", "0x10",
               "١٢٣", "1e-400", "", " ", "+", "-1"]  # fmt: skip
NUMBERS = st.one_of(st.floats().map(repr), st.integers().map(str), st.sampled_from(ODD_NUMBERS))


@st.composite
def http_dates(draw: st.DrawFn) -> str:
    """Dates as servers write Retry-After, and near misses."""
    when = draw(st.datetimes(min_value=datetime.datetime(1, 1, 1)))
    offset = draw(st.integers(-9999, 9999))
    forms = [
        email.utils.format_datetime(when, usegmt=False)[:-6] + f" {offset:+05d}",
        when.strftime("%a, %d %b %Y %H:%M:%S GMT"),
        when.strftime("%A, %d-%b-%y %H:%M:%S GMT"),
        when.strftime("%a %b %d %H:%M:%S %Y"),
        when.strftime("%d %b %Y %H:%M %z"),
    ]
    return draw(st.sampled_from(forms))


TEXT_VALUES = st.text(ANY_CHARACTER, max_size=60)
HUGE_VALUES = st.builds(
    lambda part, times: part * times, st.text(ANY_CHARACTER, min_size=1, max_size=4),
    st.integers(1, 250_000),
)  # fmt: skip
VALUE_TEXT = st.one_of(TEXT_VALUES, NUMBERS, http_dates(), HUGE_VALUES)
HEADER_VALUES = st.one_of(
    VALUE_TEXT,
    VALUE_TEXT.map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.binary(max_size=60),
)


@st.composite
def header_lists(draw: st.DrawFn) -> list[tuple[Any, Any]]:
    """Raw ``(name, value)`` pairs as the clients hand them over (str or bytes), with the
    credential headers, when drawn, carrying ``SECRET``."""
    pairs: list[tuple[Any, Any]] = []
    for _ in range(draw(st.integers(0, 10))):
        if draw(st.integers(0, 3)) == 0:
            name: Any = draw(cased(sorted(hdr.SENSITIVE_HEADERS))).strip()
            value: Any = f"{draw(TEXT_VALUES)}{SECRET}"
            if draw(st.booleans()):
                name, value = name.encode("latin-1"), value.encode("utf-8", "surrogatepass")
        else:
            name, value = draw(HEADER_NAMES), draw(HEADER_VALUES)
        pairs.append((name, value))
    return pairs


def text(raw: Any) -> str:
    """What a header name or value is, as text (latin-1 for bytes, as on the wire)."""
    return raw.decode("latin-1") if isinstance(raw, bytes) else str(raw)


@st.composite
def capture_lists(draw: st.DrawFn) -> tuple[list[str], str | None]:
    """Extra header names asked for (sensitive ones included, in any case), and the standard
    environment variable's value."""
    extra = draw(st.lists(NAME_TEXT, max_size=5))
    env = draw(st.one_of(st.none(), st.lists(NAME_TEXT, max_size=4).map(",".join)))
    return extra, env if env is None else _settable(env)


def _settable(value: str) -> str:
    """``value`` as an environment variable can hold it (no NUL, encodable)."""
    value = value.replace("\x00", "")
    try:
        os.fsencode(value)
    except UnicodeEncodeError:
        return value.encode("utf-8", "replace").decode("utf-8")
    return value


def asked_for(extra: list[str], env: str | None) -> Settings:
    """The Settings of ``capture_response_headers=extra`` (not given when empty) with the
    standard environment variable set to ``env``."""
    environ = (
        {} if env is None else {OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_RESPONSE: env}
    )
    return resolve({"capture_response_headers": extra or None}, environ)


def capture(extra: list[str], env: str | None) -> tuple[str, ...]:
    """The headers captured for ``asked_for(extra, env)``."""
    return hdr.resolve_capture_list(asked_for(extra, env).capture_response_headers)


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- the header functions ------------------------------------------------------------------------


@FUZZ
@given(header_lists(), capture_lists())
def test_select_lets_only_allow_listed_headers_through(
    headers: list[tuple[Any, Any]], asked: tuple[list[str], str | None]
) -> None:
    wanted = frozenset(capture(*asked))
    assert set(hdr.DEFAULT_RESPONSE_HEADERS) <= wanted
    assert not wanted & hdr.SENSITIVE_HEADERS
    found = hdr.select(headers, wanted)
    assert set(found) <= wanted
    for name, values in found.items():
        sent = [value for raw_name, value in headers if text(raw_name).lower() == name]
        assert len(values) == len(sent)
        assert all(isinstance(value, str) for value in values)
        assert all(SECRET not in value for value in values)
    missing = {text(n).lower() for n, _ in headers if text(n).lower() in wanted} - set(found)
    assert missing == set()


@pytest.mark.parametrize(
    ("found", "names", "expected"),
    [
        ({"a": ["1"], "b": ["2"]}, ("b", "a"), "2"),  # the order asked, not the order found
        ({"a": ["1"], "b": []}, ("b", "a"), "1"),  # a header with no value is skipped
        ({"a": ["1", "x"]}, ("a",), "1"),  # the first of a repeated header
        ({"a": ["1"]}, ("c",), None),
        ({}, (), None),
    ],
)
def test_first(found: dict[str, list[str]], names: tuple[str, ...], expected: str | None) -> None:
    assert hdr.first(found, *names) == expected


@FUZZ
@given(st.one_of(st.none(), VALUE_TEXT))
def test_parse_number(value: str | None) -> None:
    number = hdr.parse_number(value)
    assert number is None or math.isfinite(number)
    if number is not None:
        assert value is not None and float(value) == number


@FUZZ
@given(st.one_of(st.none(), VALUE_TEXT), st.one_of(st.none(), VALUE_TEXT))
def test_retry_after(retry_after_ms: str | None, retry_after: str | None) -> None:
    seconds = hdr.retry_after(retry_after_ms, retry_after)
    assert seconds is None or (math.isfinite(seconds) and seconds >= 0)


# -- the emitter ---------------------------------------------------------------------------------


@FUZZ
@given(
    headers=header_lists(),
    asked=capture_lists(),
    status=st.one_of(st.none(), st.integers(-1, 1000)),
    failed_in=st.one_of(st.none(), st.sampled_from([CONNECT, SEND, WAIT, RECEIVE])),
    body=st.lists(st.binary(max_size=40), max_size=4),
    in_call=st.booleans(),
    phase_spans=st.booleans(),
)
def test_emitter_never_raises_nor_exports_a_header_not_allow_listed(
    internal_errors: _Errors,
    headers: list[tuple[Any, Any]],
    asked: tuple[list[str], str | None],
    status: int | None,
    failed_in: int | None,
    body: list[bytes],
    in_call: bool,
    phase_spans: bool,
) -> None:
    exporter = InMemorySpanExporter()
    open_spans = OpenSpans()
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    tracer_provider.add_span_processor(open_spans)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    wanted = capture(*asked)
    emitter = Emitter(
        tracer_provider.get_tracer("fuzz"), meter_provider.get_meter("fuzz"),
        dataclasses.replace(asked_for(*asked), phase_spans=phase_spans),
    )  # fmt: skip
    token = current_call.set(LogicalCall()) if in_call else None
    try:
        attempt = Timeline("POST", "https://api.llm.test/v1/chat/completions")
        emitter.start(attempt, "api.llm.test", 443, "/v1/chat/completions", {})
        for phase in (CONNECT, SEND, WAIT, RECEIVE):
            attempt.begin(phase)
            if phase == RECEIVE:
                attempt.status_code = status
                attempt.response_headers = headers
                for chunk in body:
                    attempt.chunk(chunk)
            if failed_in == phase:
                attempt.fail(ConnectionResetError("cut"))
                break
            attempt.end_phase(phase)
        emitter.finish(attempt)
        emitter.finish(attempt)  # a second end is a no-op
    finally:
        if token is not None:
            current_call.reset(token)
    assert_no_internal_error(internal_errors)
    spans = exporter.get_finished_spans()
    assert not emitter.in_flight()
    assert len(set(open_spans.ended)) == len(open_spans.ended) == len(spans)
    (request,) = [s for s in spans if s.kind is SpanKind.CLIENT]
    for key in attributes(request):
        if key.startswith("http.response.header."):
            name = key.removeprefix("http.response.header.")
            assert name in wanted and name not in hdr.SENSITIVE_HEADERS
    if failed_in is not None:
        assert attributes(request)["llm_latency.failed_phase"] == PHASE_NAMES[failed_in]
    exported = "".join(s.to_json() for s in spans)
    data = reader.get_metrics_data()
    exported += data.to_json() if data is not None else ""
    assert SECRET not in exported
    assert_no_internal_error(internal_errors)
    meter_provider.shutdown()
    tracer_provider.shutdown()


# -- the retry helper and what a server asks it to wait ------------------------------------------


@st.composite
def absurd_waits(draw: st.DrawFn) -> dict[str, str]:
    """``retry-after-ms`` / ``Retry-After`` asking for a wait of centuries (beyond what
    ``time.sleep`` takes: 2**63 ns, 292 years)."""
    seconds = draw(st.integers(10**10, 10**30))
    date = datetime.datetime(draw(st.integers(2400, 9999)), 1, 1, tzinfo=datetime.timezone.utc)
    return draw(st.sampled_from([
        {"retry-after-ms": str(seconds * 1000)},
        {"retry-after-ms": f"{seconds * 1000:.3e}"},
        {"retry-after": str(seconds)},
        {"retry-after": email.utils.format_datetime(date, usegmt=True)},
    ]))  # fmt: skip


@settings(max_examples=10, deadline=None)
@given(absurd_waits())
def test_retry_helper_reraises_the_error_whatever_retry_after_says(asked: dict[str, str]) -> None:
    """The last exception is always re-raised unchanged (README, Retries): a 429 that asks
    for a wait no sleep can take ends the retries with that 429, not with an error of the
    helper's own (and not with a sleep of centuries)."""
    response = requests.Response()
    response.status_code = 429
    response.headers.update(asked)
    error = requests.HTTPError("429 Too Many Requests", response=response)

    @llm_latency.retry(attempts=2, base_delay=0.0)
    def call() -> None:
        raise error

    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            raised.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(5.0)
    assert not worker.is_alive(), "the helper is sleeping for what the server asked"
    assert len(raised) == 1
    assert raised[0] is error, repr(raised[0])


# -- odd status lines and header blocks from a raw socket ----------------------------------------

HEADER_BYTES = st.binary(max_size=30).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
RAW_NAMES = st.one_of(
    st.sampled_from([n.encode() for n in KNOWN_NAMES]),
    st.sampled_from([b"Content-Length", b"Transfer-Encoding", b"Content-Encoding",
                     b"Content-Type", b"Connection", b"Upgrade", b"X-Request-ID",
                     b"x-ratelimit-remaining-tokens"]),
    HEADER_BYTES,
)  # fmt: skip
RAW_VALUES = st.one_of(
    st.sampled_from([b"0", b"2", b"-1", b"abc", b"1, 2", b"99999999999999999999", b"chunked",
                     b"gzip", b"identity, chunked", b"text/event-stream", b"close",
                     b"keep-alive", b"websocket", b"nan", b"1e999", b"\xff\xfe\x00"]),
    HEADER_BYTES,
)  # fmt: skip
HEADER_LINES = st.one_of(
    st.builds(lambda name, sep, value: name + sep + value, RAW_NAMES,
              st.sampled_from([b": ", b":", b" : ", b":\t"]), RAW_VALUES),
    st.sampled_from([b"no colon here", b" folded continuation", b"\tfolded", b":", b": value",
                     b"Content-Length: 5", b"Content-Length: 1\r\nContent-Length: 2",
                     b"Transfer-Encoding: chunked", b"Content-Type: text/event-stream",
                     b"retry-after: Fri, 31 Dec 9999 23:59:59 GMT", b"x-request-id: \xe9\x00",
                     b"openai-processing-ms: NaN"]),
    HEADER_BYTES,
)  # fmt: skip
STATUS_LINES = st.one_of(
    st.builds(
        lambda version, code, reason: version + b" " + code + reason,
        st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2", b"HTTP/0.9", b"HTTP/9.9",
                         b"http/1.1", b"HTTP/1.1 ", b"ICY", b"", b"HTTP/1.1\x00"]),
        st.one_of(st.integers(0, 1000).map(lambda n: str(n).encode()),
                  st.sampled_from([b"abc", b"2OO", b"-1", b"200.0", b"", b" 200", b"0200",
                                   b"99999999999999999999", b"\xd9\xa2\xd9\xa0\xd9\xa0"])),
        st.one_of(st.just(b" OK"), st.just(b""), HEADER_BYTES.map(lambda b: b" " + b)),
    ),
    HEADER_BYTES,
)  # fmt: skip
BODIES = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"5\r\nhello\r\n0\r\n\r\n", b"ff\r\nabc", b"zz\r\n", b"data: x\n\n"]),
)


@st.composite
def raw_responses(draw: st.DrawFn) -> bytes:
    eol = draw(st.sampled_from([b"\r\n", b"\n"]))
    lines = [draw(STATUS_LINES), *draw(st.lists(HEADER_LINES, max_size=6))]
    return eol.join(lines) + eol + eol + draw(BODIES)


@pytest.fixture(scope="module")
def raw_server() -> Iterator[RawServer]:
    with RawServer(linger=1.0) as server:
        yield server


async def get(kind: str, url: str) -> tuple[int, bytes, str]:
    """GET with a fresh aiohttp session or httpx2 client; status, body and a header."""
    if kind == "aiohttp":
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(url) as response:
                body = await response.read()
                return response.status, body, response.headers.get("x-request-id", "")
    async with Client(kind, timeout=5) as client:
        result = await client.request("GET", url)
        return result.status, result.body, ""


def check_raw_response(kind: str, raw: bytes, server: RawServer, errors: _Errors) -> None:
    """Without and with the plugin the program gets the same response or exception; every
    span ends once; llm-latency raises and logs nothing of its own."""
    server.response = raw
    telemetry = Telemetry()
    telemetry.instrument()
    results: list[tuple[int, bytes, str]] = []

    async def scenario() -> None:
        results.append(await get(kind, server.url()))

    try:
        outcome = asyncio.run(compare(telemetry, scenario))  # same exception, spans end once
    finally:
        llm_latency.uninstrument()
    assert_no_internal_error(errors)
    assert outcome.kind is None or not outcome.kind.__module__.startswith("llm_latency")
    requests_ = telemetry.requests()
    assert requests_, "no request span"
    last = max(requests_, key=lambda s: s.end_time or 0)
    if outcome.kind is None:
        assert len(results) == 2 and results[0] == results[1]
        assert attributes(last).get("http.response.status_code") == results[1][0]
        # A response for the program is no failure on the span (a 4xx/5xx is its status).
        status = results[1][0]
        failure = [attributes(last).get(k) for k in ("llm_latency.failed_phase", "error.type")]
        assert failure == [None, str(status) if status >= 400 else None]
    else:
        assert "error.type" in attributes(last)
    # Spans can be serialized (attribute values of any bytes the server sent).
    json.loads(last.to_json())


#: Always tried, besides the drawn ones: a body that ends at the close, a bare status line.
KNOWN_ODD = [b"HTTP/1.1 200 OK\r\n\r\n", b"HTTP/1.0 200 OK\r\n\r\n{}", b"HTTP/1.1 abc\r\n\r\n"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw_responses())
@example(KNOWN_ODD[0])
@example(KNOWN_ODD[1])
@example(KNOWN_ODD[2])
def test_odd_responses_aiohttp(raw_server: RawServer, internal_errors: _Errors, raw: bytes) -> None:
    check_raw_response("aiohttp", raw, raw_server, internal_errors)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw_responses(), st.sampled_from(["httpx2-async", "httpx2-sync"]))
@example(KNOWN_ODD[0], "httpx2-async")
@example(KNOWN_ODD[1], "httpx2-sync")
@example(KNOWN_ODD[2], "httpx2-async")
def test_odd_responses_httpx2(
    raw_server: RawServer, internal_errors: _Errors, raw: bytes, kind: str
) -> None:
    check_raw_response(kind, raw, raw_server, internal_errors)


def test_the_raw_server_really_sends_what_it_is_given(raw_server: RawServer) -> None:
    raw_server.response = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Request-ID: r1\r\n\r\n{}"
    assert asyncio.run(get("aiohttp", raw_server.url())) == (200, b"{}", "r1")
    assert httpx2.get(raw_server.url(), timeout=5).headers["x-request-id"] == "r1"
