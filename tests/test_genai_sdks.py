"""The real google-genai, mistralai, cohere and groq SDKs against a loopback server in each
provider's shape: each SDK call is one logical span, its attempts request spans with the
provider's request id, server time and phases, its retries grouped with ``retry.backoff``
spans between them, its streams timed to their end; and each call ends as it would without
llm-latency."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cohere
import groq
import httpx
import pytest
from google import genai
from google.genai import types as genai_types
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

import llm_latency
from tests.attributes import attributes
from tests.checks import compare, run
from tests.conftest import Telemetry, seconds
from tests.genai_api import (
    HEADERS,
    PROMPT_TOKENS,
    RATE_LIMITED_IDS,
    RETRY_AFTER_MS,
    TOKEN_GAP,
    TOKENS,
    WAIT,
    GenAIServer,
    genai_server,
)

MESSAGES = [{"role": "user", "content": "hi"}]
TEXT = "".join(TOKENS)
EARLY = 0.005  # timers may fire this much early

try:  # mistralai 2.x and later
    from mistralai.client import Mistral
    from mistralai.client.utils import BackoffStrategy, RetryConfig
except ImportError:  # 1.x
    from mistralai import Mistral  # type: ignore[attr-defined,no-redef]
    from mistralai.utils import BackoffStrategy, RetryConfig  # type: ignore[no-redef]


@pytest.fixture
async def provider() -> AsyncIterator[GenAIServer]:
    async with genai_server() as server:
        yield server


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(attributes(span))


def children(telemetry: Telemetry, parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return sorted(
        (s for s in telemetry.spans() if s.parent and s.parent.span_id == parent.context.span_id),
        key=lambda s: s.start_time or 0,
    )


@dataclass(frozen=True)
class Expected:
    """What one provider's spans say."""

    provider: str  # genai_api's name for it
    call: str  # the logical call span
    attempt: str  # each request span
    request_id: str | None  # the header carrying the provider's request id
    server_time: bool = True  # whether the provider says how long it took, in a header
    #: ``gen_ai.provider.name`` on loopback: only a provider's own routes name it there.
    genai_name: str | None = None

    def id_of(self, failed: bool) -> tuple[str, ...]:
        assert self.request_id is not None
        ids = RATE_LIMITED_IDS[self.provider] if failed else HEADERS[self.provider]
        return (ids[self.request_id],)


GEMINI = Expected(
    "gemini",
    "google-genai models.generateContent",
    "POST /v1beta/models/{model}:generateContent",
    None,
    genai_name="gcp.gemini",
)
GEMINI_STREAM = Expected(
    "gemini",
    "google-genai models.streamGenerateContent",
    "POST /v1beta/models/{model}:streamGenerateContent",
    None,
    genai_name="gcp.gemini",
)
MISTRAL = Expected(
    "mistral",
    "mistralai chat.completions",
    "POST /v1/chat/completions",
    "mistral-correlation-id",
)
COHERE = Expected("cohere", "cohere chat", "POST /v2/chat", "x-debug-trace-id", genai_name="cohere")
# Groq's time on the request is in the body's usage (queue_time, total_time), in no header.
GROQ = Expected(
    "groq",
    "groq chat.completions",
    "POST /v1/chat/completions",
    "x-request-id",
    server_time=False,
)


async def run_same(telemetry: Telemetry, scenario: Callable[[], Awaitable[Any]]) -> None:
    """The scenario ends the same way without and with llm-latency, and without error."""
    outcome = await compare(telemetry, scenario)
    assert outcome.kind is None, outcome.text


def assert_call(
    telemetry: Telemetry, expected: Expected, failures: int = 0, counted: bool = True
) -> tuple[ReadableSpan, ReadableSpan]:
    """One call span (a root: the test has no span of its own) with, under it, attempt,
    backoff, attempt, ...: ``failures`` 429s, then the success; each attempt numbered, named,
    with the provider's request id and server time and its phases, and the answer's tokens as
    the server counted them (``counted``; else a stream that said none). Returns the call and
    the successful attempt."""
    (call,) = [s for s in telemetry.spans() if s.name == expected.call]
    assert call.parent is None
    assert attrs(call)["llm_latency.attempts"] == failures + 1
    assert attrs(call)["llm_latency.sdk"] == expected.call.split()[0]
    spans = children(telemetry, call)
    kinds = ["attempt" if s.kind is SpanKind.CLIENT else s.name for s in spans]
    assert kinds == ["attempt"] + ["retry.backoff", "attempt"] * failures
    attempts, waits = spans[0::2], spans[1::2]
    assert {a.name for a in attempts} == {expected.attempt}
    assert [attrs(a).get("http.request.resend_count", 0) for a in attempts] == list(
        range(failures + 1)
    )
    assert [attrs(a)["http.response.status_code"] for a in attempts] == [429] * failures + [200]
    assert [attrs(w)["llm_latency.backoff.reason"] for w in waits] == ["429"] * failures
    for before, wait, after in zip(attempts, waits, attempts[1:], strict=False):
        assert (before.end_time or 0) <= (wait.start_time or 0)
        assert (wait.end_time or 0) <= (after.start_time or 0)
    if expected.request_id is not None:
        header = f"http.response.header.{expected.request_id}"
        assert [attrs(a)[header] for a in attempts] == [expected.id_of(True)] * failures + [
            expected.id_of(False)
        ]
    ok = attempts[-1]
    if expected.server_time:
        assert attrs(ok)["llm_latency.server.processing_time"] == pytest.approx(WAIT)
    else:
        assert "llm_latency.server.processing_time" not in attrs(ok)
    assert {"send", "wait", "receive"} <= set(telemetry.phases(ok))
    assert seconds(telemetry.phases(ok)["wait"]) >= WAIT - EARLY
    assert (call.end_time or 0) >= (ok.end_time or 0)
    for span in (call, ok):
        found = attrs(span)
        assert found.get("gen_ai.provider.name") == expected.genai_name
        if counted:
            tokens = (found["gen_ai.usage.input_tokens"], found["gen_ai.usage.output_tokens"])
            assert tokens == (PROMPT_TOKENS, len(TOKENS))
        else:
            assert found["llm_latency.usage.unknown"] is True
            assert not [name for name in found if name.startswith("gen_ai.usage.")]
    telemetry.assert_tiles()
    telemetry.assert_all_ended_once()
    return call, ok


def assert_stream(ok: ReadableSpan, events: int) -> None:
    """The attempt lasted to the end of its stream, and counted its events."""
    a = attrs(ok)
    assert a["llm_latency.stream.events"] == events
    assert a["gen_ai.response.time_to_first_chunk"] >= WAIT - EARLY
    assert a["llm_latency.stream.max_gap"] + a.get("llm_latency.event_loop.lag", 0.0) >= (
        TOKEN_GAP - EARLY
    )  # the longest gap leaves out what a late loop held a chunk back
    assert seconds(ok) >= WAIT + (len(TOKENS) - 1) * TOKEN_GAP - EARLY


async def call(is_async: bool, work: Callable[[], Any]) -> Any:
    """An SDK call: awaited for async clients, in a thread for sync ones (the server runs on
    this loop)."""
    if is_async:
        return await work()
    return await asyncio.to_thread(work)


# -- google-genai --------------------------------------------------------------------------------

#: How the google-genai client sends: sync (httpx2, its default), async over aiohttp (its
#: default when aiohttp is installed) or async over an httpx client the program gives it.
GENAI_TRANSPORTS = ["sync", "async-aiohttp", "async-httpx"]


@contextlib.asynccontextmanager
async def genai_client(
    provider: GenAIServer, transport: str, retries: int = 0
) -> AsyncIterator[genai.Client]:
    """A client for ``transport``; closed after, with the httpx client given to it."""
    options: dict[str, Any] = {"base_url": provider.base("gemini"), "api_version": "v1beta"}
    if retries:
        options["retry_options"] = genai_types.HttpRetryOptions(
            attempts=retries + 1, initial_delay=0.05, max_delay=0.1, jitter=0.0,
            http_status_codes=[429],
        )  # fmt: skip
    http = httpx.AsyncClient() if transport == "async-httpx" else None
    if http is not None:
        options["httpx_async_client"] = http
    client = genai.Client(api_key="gemini-key", http_options=genai_types.HttpOptions(**options))
    try:
        if transport == "sync":
            yield client
            await asyncio.to_thread(client.close)
        else:
            async with client.aio:
                yield client
    finally:
        if http is not None:
            await http.aclose()


async def genai_generate(provider: GenAIServer, transport: str, retries: int = 0) -> str:
    async with genai_client(provider, transport, retries) as client:
        if transport == "sync":
            response = await asyncio.to_thread(
                client.models.generate_content, model="gemini-test", contents="hi"
            )
        else:
            response = await client.aio.models.generate_content(model="gemini-test", contents="hi")
    assert response.text == TEXT
    return TEXT


async def genai_stream(provider: GenAIServer, transport: str) -> str:
    async with genai_client(provider, transport) as client:
        if transport == "sync":

            def read() -> list[str]:
                stream = client.models.generate_content_stream(model="gemini-test", contents="hi")
                return [chunk.text or "" for chunk in stream]

            texts = await asyncio.to_thread(read)
        else:
            stream = await client.aio.models.generate_content_stream(
                model="gemini-test", contents="hi"
            )
            texts = [chunk.text or "" async for chunk in stream]
    assert texts == TOKENS
    return TEXT


@pytest.mark.parametrize("transport", GENAI_TRANSPORTS)
async def test_genai_generate_content(
    telemetry: Telemetry, provider: GenAIServer, transport: str
) -> None:
    await run_same(telemetry, lambda: genai_generate(provider, transport))
    _, ok = assert_call(telemetry, GEMINI)
    # Gemini's only timing header: Google's front end's Server-Timing.
    assert attrs(ok)["http.response.header.server-timing"] == ("gfet4t7; dur=50",)
    assert provider.paths[-1] == "/gemini/v1beta/models/gemini-test:generateContent"


@pytest.mark.parametrize("transport", GENAI_TRANSPORTS)
async def test_genai_streamed(telemetry: Telemetry, provider: GenAIServer, transport: str) -> None:
    await run_same(telemetry, lambda: genai_stream(provider, transport))
    _, ok = assert_call(telemetry, GEMINI_STREAM)
    assert_stream(ok, len(TOKENS))
    assert attrs(ok)["url.full"].endswith(":streamGenerateContent?alt=sse")


@pytest.mark.parametrize("transport", GENAI_TRANSPORTS)
async def test_genai_retries_grouped(
    telemetry: Telemetry, provider: GenAIServer, transport: str
) -> None:
    async def scenario() -> str:
        provider.fail_next = 2
        return await genai_generate(provider, transport, retries=2)

    await run_same(telemetry, scenario)
    call_span, _ = assert_call(telemetry, GEMINI, failures=2)
    waits = [s for s in children(telemetry, call_span) if s.name == "retry.backoff"]
    # tenacity's exponential waits (no jitter): 0.05 s, then 0.1 s.
    for wait, delay in zip(waits, (0.05, 0.1), strict=True):
        assert seconds(wait) >= delay - EARLY


# -- mistralai -----------------------------------------------------------------------------------


def mistral_retries() -> Any:
    return RetryConfig(
        "backoff", BackoffStrategy(50, 100, 1.1, 5000), retry_connection_errors=False
    )


async def mistral_chat(provider: GenAIServer, is_async: bool, stream: bool = False) -> str:
    kwargs: dict[str, Any] = {"model": "mistral-test", "messages": MESSAGES}
    kwargs["retries"] = mistral_retries()

    def client() -> Any:
        return Mistral(api_key="mistral-key", server_url=provider.base("mistral"))

    if is_async:
        async with client() as mistral:
            if not stream:
                response = await mistral.chat.complete_async(**kwargs)
                return str(response.choices[0].message.content)
            events = await mistral.chat.stream_async(**kwargs)
            return "".join([e.data.choices[0].delta.content async for e in events])

    def sync() -> str:
        with client() as mistral:
            if not stream:
                return str(mistral.chat.complete(**kwargs).choices[0].message.content)
            return "".join(e.data.choices[0].delta.content for e in mistral.chat.stream(**kwargs))

    return await asyncio.to_thread(sync)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_mistral_chat(telemetry: Telemetry, provider: GenAIServer, is_async: bool) -> None:
    async def scenario() -> None:
        assert await mistral_chat(provider, is_async) == TEXT

    await run_same(telemetry, scenario)
    _, ok = assert_call(telemetry, MISTRAL)
    assert attrs(ok)["http.response.header.x-ratelimit-remaining-req-minute"] == ("59",)
    assert attrs(ok)["http.response.header.x-kong-request-id"] == ("corr_mistral_1",)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_mistral_streamed(
    telemetry: Telemetry, provider: GenAIServer, is_async: bool
) -> None:
    async def scenario() -> None:
        assert await mistral_chat(provider, is_async, stream=True) == TEXT

    await run_same(telemetry, scenario)
    _, ok = assert_call(telemetry, MISTRAL, counted=False)
    assert_stream(ok, len(TOKENS) + 1)  # and [DONE]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_mistral_retries_grouped(
    telemetry: Telemetry, provider: GenAIServer, is_async: bool
) -> None:
    async def scenario() -> None:
        provider.fail_next = 2
        assert await mistral_chat(provider, is_async) == TEXT

    await run_same(telemetry, scenario)
    assert_call(telemetry, MISTRAL, failures=2)


# -- cohere --------------------------------------------------------------------------------------


async def cohere_chat(provider: GenAIServer, is_async: bool, stream: bool = False) -> str:
    factory = cohere.AsyncClientV2 if is_async else cohere.ClientV2
    http: Any = httpx.AsyncClient() if is_async else httpx.Client()
    client: Any = factory(api_key="cohere-key", base_url=provider.base("cohere"), httpx_client=http)
    options = {"max_retries": 2}
    kwargs: dict[str, Any] = {"model": "command-test", "messages": MESSAGES}

    def text(event: Any) -> str:
        return str(event.delta.message.content.text) if event.type == "content-delta" else ""

    try:
        if not stream:
            response = await call(is_async, lambda: client.chat(**kwargs, request_options=options))
            return str(response.message.content[0].text)
        if is_async:
            return "".join([text(e) async for e in client.chat_stream(**kwargs)])
        return "".join(
            await asyncio.to_thread(lambda: [text(e) for e in client.chat_stream(**kwargs)])
        )
    finally:
        await (http.aclose() if is_async else asyncio.to_thread(http.close))


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_cohere_chat(telemetry: Telemetry, provider: GenAIServer, is_async: bool) -> None:
    async def scenario() -> None:
        assert await cohere_chat(provider, is_async) == TEXT

    await run_same(telemetry, scenario)
    _, ok = assert_call(telemetry, COHERE)
    assert attrs(ok)["http.response.header.x-trial-endpoint-call-remaining"] == ("9",)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_cohere_streamed(telemetry: Telemetry, provider: GenAIServer, is_async: bool) -> None:
    async def scenario() -> None:
        assert await cohere_chat(provider, is_async, stream=True) == TEXT

    await run_same(telemetry, scenario)
    _, ok = assert_call(telemetry, COHERE)
    assert_stream(ok, len(TOKENS) + 4)  # message and content start and end events


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_cohere_retries_grouped(
    telemetry: Telemetry, provider: GenAIServer, is_async: bool
) -> None:
    """cohere's request calls itself for each retry: still one call, its attempts under it."""

    async def scenario() -> None:
        provider.fail_next = 2
        assert await cohere_chat(provider, is_async) == TEXT

    await run_same(telemetry, scenario)
    call_span, _ = assert_call(telemetry, COHERE, failures=2)
    for wait in [s for s in children(telemetry, call_span) if s.name == "retry.backoff"]:
        assert seconds(wait) >= RETRY_AFTER_MS / 1000 - EARLY  # as retry-after-ms asked


# -- groq ----------------------------------------------------------------------------------------


async def groq_chat(provider: GenAIServer, is_async: bool, stream: bool = False) -> str:
    factory = groq.AsyncGroq if is_async else groq.Groq
    client: Any = factory(api_key="gsk-key", base_url=provider.base("groq"), max_retries=2)
    kwargs: dict[str, Any] = {"model": "groq-test", "messages": MESSAGES}
    try:
        if not stream:
            completion = await call(is_async, lambda: client.chat.completions.create(**kwargs))
            return str(completion.choices[0].message.content)
        if is_async:
            chunks = await client.chat.completions.create(**kwargs, stream=True)
            return "".join([c.choices[0].delta.content async for c in chunks])
        return "".join(
            await asyncio.to_thread(
                lambda: [
                    c.choices[0].delta.content
                    for c in client.chat.completions.create(**kwargs, stream=True)
                ]
            )
        )
    finally:
        await (client.close() if is_async else asyncio.to_thread(client.close))


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_groq_chat(telemetry: Telemetry, provider: GenAIServer, is_async: bool) -> None:
    async def scenario() -> None:
        assert await groq_chat(provider, is_async) == TEXT

    await run_same(telemetry, scenario)
    _, ok = assert_call(telemetry, GROQ)
    assert attrs(ok)["http.response.header.x-groq-region"] == ("test",)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_groq_streamed(telemetry: Telemetry, provider: GenAIServer, is_async: bool) -> None:
    async def scenario() -> None:
        assert await groq_chat(provider, is_async, stream=True) == TEXT

    await run_same(telemetry, scenario)
    _, ok = assert_call(telemetry, GROQ, counted=False)
    assert_stream(ok, len(TOKENS) + 1)  # and [DONE]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_groq_retries_grouped(
    telemetry: Telemetry, provider: GenAIServer, is_async: bool
) -> None:
    async def scenario() -> None:
        provider.fail_next = 1
        assert await groq_chat(provider, is_async) == TEXT

    await run_same(telemetry, scenario)
    call_span, _ = assert_call(telemetry, GROQ, failures=1)
    (wait,) = [s for s in children(telemetry, call_span) if s.name == "retry.backoff"]
    assert attrs(wait)["llm_latency.backoff.retry_after"] == pytest.approx(RETRY_AFTER_MS / 1000)


# -- retries exhausted ---------------------------------------------------------------------------


@pytest.mark.parametrize("sdk", ["google-genai", "cohere", "groq"])
async def test_retries_exhausted_end_the_call_with_the_sdks_error(
    telemetry: Telemetry, provider: GenAIServer, sdk: str
) -> None:
    """Every attempt rate-limited: the program gets the SDK's own error, as without
    llm-latency, and the call span ends with it after the three attempts."""
    calls: dict[str, tuple[Callable[[], Awaitable[Any]], Expected]] = {
        "google-genai": (lambda: genai_generate(provider, "async-aiohttp", retries=2), GEMINI),
        "cohere": (lambda: cohere_chat(provider, True), COHERE),
        "groq": (lambda: groq_chat(provider, True), GROQ),
    }
    work, expected = calls[sdk]

    async def scenario() -> Any:
        provider.fail_next = 3
        return await work()

    # The error's text may quote the response's Date header: the two runs compare by kind.
    llm_latency.uninstrument()
    bare = await run(scenario)
    telemetry.instrument()
    outcome = await run(scenario)
    telemetry.assert_all_ended_once()
    assert outcome.kind is bare.kind and outcome.kind is not None
    assert "429" in outcome.text + outcome.kind.__name__
    (call_span,) = [s for s in telemetry.spans() if s.name == expected.call]
    assert attrs(call_span)["llm_latency.attempts"] == 3
    assert call_span.status.status_code is StatusCode.ERROR
    # The SDK's exception when it raised inside the call; cohere's request returns the last
    # 429 and its caller raises: the call says what its last attempt got.
    assert attrs(call_span)["error.type"] == ("429" if sdk == "cohere" else outcome.kind.__name__)
    under = children(telemetry, call_span)
    assert [s.name for s in under] == [expected.attempt, "retry.backoff"] * 2 + [expected.attempt]
    assert [attrs(s)["http.response.status_code"] for s in under[0::2]] == [429] * 3


# -- beside the official GenAI instrumentation, and lazily --------------------------------------


async def test_a_current_genai_span_is_the_parent(
    telemetry: Telemetry, provider: GenAIServer
) -> None:
    """A GenAI instrumentation's span (any current span with a ``gen_ai.*`` attribute, as
    opentelemetry-instrumentation-google-genai opens around generate_content) is the call:
    the attempts and the wait go under it, no call span is added, and each attempt is the one
    CLIENT span of its HTTP exchange."""
    tracer = telemetry.tracer_provider.get_tracer("genai-instrumentation")
    with tracer.start_as_current_span(
        "generate_content gemini-test",
        kind=SpanKind.CLIENT,
        attributes={"gen_ai.operation.name": "generate_content", "gen_ai.system": "gemini"},
    ) as genai_span:
        provider.fail_next = 1
        assert await genai_generate(provider, "async-aiohttp", retries=1) == TEXT
    assert [s for s in telemetry.spans() if s.name.startswith("google-genai ")] == []
    (parent,) = [s for s in telemetry.spans() if s.name == "generate_content gemini-test"]
    assert parent.context is not None
    assert parent.context.span_id == genai_span.get_span_context().span_id
    under = children(telemetry, parent)
    assert [s.name for s in under] == [GEMINI.attempt, "retry.backoff", GEMINI.attempt]
    assert [s.kind for s in under] == [SpanKind.CLIENT, SpanKind.INTERNAL, SpanKind.CLIENT]
    assert attrs(under[2])["http.request.resend_count"] == 1


async def test_instrument_imports_no_sdk_and_hooks_each_when_imported(
    provider: GenAIServer,
) -> None:
    program = Path(__file__).parent / "programs" / "lazy_genai_sdks.py"
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(program), provider.base("groq"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    assert out.decode().splitlines() == [
        "OK imported by instrument(): []",
        "OK groq chat.completions > POST /v1/chat/completions",
        "OK hooked: google-genai mistralai cohere",
    ]


def test_tested_versions_are_in_the_supported_ranges() -> None:
    """The SDK versions these tests ran with are ones instrument() hooks (no range skips them)."""
    from opentelemetry.instrumentation.dependencies import get_dependency_conflicts

    from llm_latency.instrumentor import SDKS

    for name in ("google-genai", "mistralai", "cohere", "groq"):
        assert get_dependency_conflicts([SDKS[name].requirement]) is None, (
            name,
            importlib.metadata.version(SDKS[name].distribution),
        )
