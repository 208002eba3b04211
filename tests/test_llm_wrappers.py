"""Wrappers over the SDKs, for real against the mock server on loopback: litellm (through the
openai SDK, and through its own httpx handler), langchain-openai's ChatOpenAI (on the openai
SDK) and the ollama client get what the openai and anthropic SDKs get: the attempt span named
after the route, the provider's request id (none invented where the provider sends none), the
server's own time, phases tiling the attempt, the stream's end, and the retries of one call
under one logical parent with a ``retry.backoff`` span per wait.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

# litellm fetches its price list at import unless told to use the copy it ships.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import litellm
import ollama
import pytest
from dirty_equals import IsFloat, IsStr
from langchain_openai import ChatOpenAI
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode
from pydantic import SecretStr

import llm_latency
from llm_latency.diagnosis.records import calls_from_spans, from_readable_spans
from llm_latency.testing import Profile, RunningServer, running
from tests.checks import compare
from tests.conftest import Telemetry, seconds
from tests.span_tree import phase_nodes, span_tree
from tests.test_sdks import post_to

litellm.suppress_debug_info = True

TOKENS = 3
TTFB = 0.05
EARLY = 0.005  # a timer may fire this much before its deadline
MESSAGES = [{"role": "user", "content": "hi"}]
ANSWER = "".join(f"token{i} " for i in range(TOKENS))

# -- nothing leaves loopback ------------------------------------------------------------------

_guarding = False
_off_loopback: list[object] = []


def _loopback(host: object) -> bool:
    if host is None or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _guarding:
        return
    if event == "socket.getaddrinfo" and not _loopback(args[0]):
        _off_loopback.append(args[0])
    elif event == "socket.connect" and isinstance(args[1], tuple) and not _loopback(args[1][0]):
        _off_loopback.append(args[1])


sys.addaudithook(_audit)


@pytest.fixture(autouse=True)
def _loopback_only() -> Iterator[None]:
    """Every test here: no name looked up and no connection made off loopback (litellm and
    langchain would phone home for prices, tokenizers or tracing if let)."""
    global _guarding
    _off_loopback.clear()
    _guarding = True
    try:
        yield
    finally:
        _guarding = False
    assert _off_loopback == []


@pytest.fixture
async def server() -> AsyncIterator[RunningServer]:
    profile = Profile(ttfb=TTFB, tokens=TOKENS, tokens_per_second=200, retry_after_ms=100)
    async with running(profile) as mock:
        yield mock


# -- helpers ----------------------------------------------------------------------------------


async def call(is_async: bool, work: Callable[[], Any]) -> Any:
    """Awaited for async clients, in a thread for sync ones."""
    if is_async:
        return await work()
    return await asyncio.to_thread(work)


def attributes(span: ReadableSpan) -> dict[str, Any]:
    assert span.attributes is not None
    return dict(span.attributes)


def by_start(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return sorted(spans, key=lambda s: s.start_time or 0)


def children(telemetry: Telemetry, parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return by_start(
        [s for s in telemetry.spans()
         if s.parent is not None and s.parent.span_id == parent.context.span_id]
    )  # fmt: skip


def named(telemetry: Telemetry, prefix: str) -> list[ReadableSpan]:
    return [s for s in telemetry.spans() if s.name.startswith(prefix)]


def assert_phases(telemetry: Telemetry, attempt: ReadableSpan) -> None:
    """The attempt's phases tile it, and include the server's wait and the answer's receipt."""
    telemetry.assert_tiles()
    assert {"send", "wait", "receive"} <= set(telemetry.phases(attempt))


def assert_no_request_id(attempt: ReadableSpan) -> None:
    """Ollama sends no request id: none is made up."""
    invented = [k for k in attributes(attempt) if "request-id" in k or "request_id" in k]
    assert invented == []


def assert_grouped_retries(
    telemetry: Telemetry, parent: ReadableSpan, statuses: list[int], reason: str = "429"
) -> list[ReadableSpan]:
    """Under ``parent``: the attempts with these statuses, numbered 0, 1, ..., and one
    ``retry.backoff`` between each failed attempt and the next, inside the gap. The diagnosis
    records read them back as one logical call."""
    under = children(telemetry, parent)
    attempts = [s for s in under if "url.full" in attributes(s)]
    backoffs = [s for s in under if s.name == "retry.backoff"]
    assert [attributes(a)["http.response.status_code"] for a in attempts] == statuses
    resends = [attributes(a).get("http.request.resend_count", 0) for a in attempts]
    assert resends == list(range(len(statuses)))
    assert len(backoffs) == len(statuses) - 1
    for failed, backoff, following in zip(attempts, backoffs, attempts[1:], strict=False):
        assert attributes(backoff)["llm_latency.backoff.reason"] == reason
        assert (failed.end_time or 0) <= (backoff.start_time or 0)
        assert (backoff.end_time or 0) <= (following.start_time or 0)
    assert attributes(parent)["llm_latency.attempts"] == len(statuses)
    (logical,) = calls_from_spans(from_readable_spans(telemetry.spans()))
    assert (len(logical.attempts), len(logical.backoffs)) == (len(statuses), len(statuses) - 1)
    return attempts


# -- litellm ------------------------------------------------------------------------------------


def litellm_openai(server: RunningServer, **extra: Any) -> dict[str, Any]:
    """litellm's arguments for the OpenAI route, which litellm runs on the openai SDK."""
    return {"model": "openai/gpt-test", "messages": MESSAGES, "api_base": server.url("/v1"),
            "api_key": "sk-litellm", **extra}  # fmt: skip


def litellm_call(is_async: bool, **kwargs: Any) -> Callable[[], Any]:
    if is_async:
        return lambda: litellm.acompletion(**kwargs)
    return lambda: litellm.completion(**kwargs)


def the_litellm_span(telemetry: Telemetry, is_async: bool) -> ReadableSpan:
    """The one logical parent: the litellm call, with no openai SDK span beneath it."""
    (parent,) = named(telemetry, "litellm ")
    assert parent.name == ("litellm acompletion" if is_async else "litellm completion")
    assert parent.parent is None
    attrs = attributes(parent)
    assert attrs["llm_latency.sdk"] == "litellm"
    assert (
        attrs["gen_ai.request.model"].endswith("-test") or "llama" in attrs["gen_ai.request.model"]
    )
    assert named(telemetry, "openai ") == []
    return parent


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_litellm_completion(
    telemetry: Telemetry, server: RunningServer, is_async: bool
) -> None:
    answers: list[Any] = []

    async def scenario() -> None:
        answer = await call(is_async, litellm_call(is_async, **litellm_openai(server)))
        assert answer.choices[0].message.content == ANSWER
        answers.append(answer)

    assert (await compare(telemetry, scenario)).kind is None
    # The request id the program's answer carries is the one on the span.
    sent = answers[-1]._hidden_params["additional_headers"]["llm_provider-x-request-id"]
    lag: dict[str, Any] = {"llm_latency.event_loop.lag": IsFloat()} if is_async else {}
    # The tokens on the spans are the ones the program's answer counts (the mock's).
    usage = answers[-1].usage
    tokens = {
        "gen_ai.response.model": "gpt-test",
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.output_tokens": usage.completion_tokens,
        # cached and reasoning tokens: reported as 0 (OpenAI's shape), which says nothing
        "llm_latency.server.time_per_output_token_max": IsFloat(gt=0),
        "llm_latency.request_id": sent,
    }
    # One logical parent, the litellm call, and no openai SDK span beneath it.
    expected: list[dict[str, Any]] = [
        {
            "name": "litellm acompletion" if is_async else "litellm completion",
            "kind": "INTERNAL",
            "attributes": {
                **tokens,
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "openai/gpt-test",
                "llm_latency.attempts": 1,
                "llm_latency.sdk": "litellm",
            },
            "children": [
                {
                    "name": "POST /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        **lag,
                        **tokens,
                        **post_to("/v1/chat/completions"),
                        "http.response.header.openai-model": ["mock-gpt"],
                        "http.response.header.openai-processing-ms": [IsStr(regex=r"\d+")],
                        "http.response.header.x-ratelimit-limit-requests": ["500"],
                        "http.response.header.x-ratelimit-limit-tokens": ["200000"],
                        "http.response.header.x-ratelimit-remaining-requests": ["498"],
                        "http.response.header.x-ratelimit-remaining-tokens": ["199800"],
                        "http.response.header.x-ratelimit-reset-requests": ["1s"],
                        "http.response.header.x-request-id": [sent],
                        "http.response.status_code": 200,
                        "llm_latency.connection.reused": True,
                        "llm_latency.network_overhead": IsFloat(ge=0),
                        "llm_latency.server.processing_time": IsFloat(ge=TTFB - EARLY),
                    },
                    "children": phase_nodes("send", "wait", "receive"),
                }
            ],
        }
    ]
    assert span_tree(telemetry.spans()) == expected
    telemetry.assert_tiles()


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_litellm_stream(telemetry: Telemetry, server: RunningServer, is_async: bool) -> None:
    def read() -> Any:
        if is_async:

            async def chunks() -> list[str | None]:
                stream = await litellm.acompletion(stream=True, **litellm_openai(server))
                return [c.choices[0].delta.content async for c in stream]

            return chunks()
        stream = litellm.completion(stream=True, **litellm_openai(server))
        return [c.choices[0].delta.content for c in stream]

    async def scenario() -> None:
        assert "".join(filter(None, await call(is_async, read))) == ANSWER

    assert (await compare(telemetry, scenario)).kind is None
    parent = the_litellm_span(telemetry, is_async)
    (attempt,) = telemetry.requests()
    attrs = attributes(attempt)
    assert attrs["http.response.header.x-request-id"][0].startswith("req_")
    # A chunk per token, the finish chunk, then [DONE]: the stream was read to its end.
    assert attrs["llm_latency.stream.events"] == TOKENS + 2
    assert attrs["gen_ai.response.time_to_first_chunk"] >= TTFB - EARLY
    # The call lasts as long as its stream: it ends with the attempt, not at the headers.
    assert (parent.end_time or 0) >= (attempt.end_time or 0)
    assert_phases(telemetry, attempt)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_litellm_num_retries_one_call(
    telemetry: Telemetry, server: RunningServer, is_async: bool
) -> None:
    """``num_retries=1``: litellm hands it to the openai SDK (two attempts, the SDK waiting as
    the server asks), then retries the whole call once more itself with the SDK's retries off.
    All three attempts are one call."""

    async def scenario() -> None:
        server.state.rate_limit_next = 2
        kwargs = litellm_openai(server, num_retries=1)
        answer = await call(is_async, litellm_call(is_async, **kwargs))
        assert answer.choices[0].message.content == ANSWER
        assert server.state.rate_limit_next == 0

    assert (await compare(telemetry, scenario)).kind is None
    parent = the_litellm_span(telemetry, is_async)
    attempts = assert_grouped_retries(telemetry, parent, [429, 429, 200])
    ids = [attributes(a)["http.response.header.x-request-id"] for a in attempts]
    assert len(set(ids)) == 3
    first_wait = children(telemetry, parent)[1]
    # The SDK's own wait honoured retry-after-ms (100 ms); litellm's outer retry does not wait.
    assert attributes(first_wait)["llm_latency.backoff.retry_after"] == pytest.approx(0.1)
    assert seconds(first_wait) >= 0.1 - EARLY
    for attempt in attempts:
        assert_phases(telemetry, attempt)


async def test_litellm_retries_exhausted_fail_the_call(
    telemetry: Telemetry, server: RunningServer
) -> None:
    async def scenario() -> None:
        server.state.rate_limit_next = 10
        try:
            await asyncio.to_thread(litellm.completion, **litellm_openai(server, num_retries=1))
        finally:
            server.state.rate_limit_next = 0

    outcome = await compare(telemetry, scenario)
    assert outcome.kind is litellm.exceptions.RateLimitError
    parent = the_litellm_span(telemetry, False)
    assert parent.status.status_code is StatusCode.ERROR
    assert attributes(parent)["error.type"] == "RateLimitError"
    assert_grouped_retries(telemetry, parent, [429, 429, 429])


async def test_litellm_own_http_handler(telemetry: Telemetry, server: RunningServer) -> None:
    """Anthropic through litellm's own httpx handler (no SDK): the provider's request id, and
    litellm's retry of the whole call under the same parent."""

    async def scenario() -> None:
        server.state.rate_limit_next = 1
        answer = await litellm.acompletion(
            model="anthropic/claude-test", messages=MESSAGES, api_base=server.url(""),
            api_key="sk-ant-litellm", max_tokens=16, num_retries=1,
        )  # fmt: skip
        assert answer.choices[0].message.content == ANSWER

    assert (await compare(telemetry, scenario)).kind is None
    parent = the_litellm_span(telemetry, True)
    attempts = assert_grouped_retries(telemetry, parent, [429, 200])
    for attempt in attempts:
        assert attempt.name == "POST /v1/messages"
        assert attributes(attempt)["http.response.header.request-id"][0].startswith("req_")
        assert "http.response.header.x-request-id" not in attributes(attempt)
        assert_phases(telemetry, attempt)


async def test_litellm_ollama_stream(telemetry: Telemetry, server: RunningServer) -> None:
    # A model litellm knows: of one it does not, it asks Ollama's default address
    # (localhost:11434/api/show) inside the call, whatever api_base says.
    litellm.model_cost["ollama_chat/llama-test"] = {
        "litellm_provider": "ollama_chat", "mode": "chat", "max_tokens": 64,
        "input_cost_per_token": 0.0, "output_cost_per_token": 0.0,
    }  # fmt: skip

    def read() -> str:
        stream = litellm.completion(
            model="ollama_chat/llama-test", messages=MESSAGES, api_base=server.url(""), stream=True
        )
        return "".join(c.choices[0].delta.content or "" for c in stream)

    async def scenario() -> None:
        assert await asyncio.to_thread(read) == ANSWER

    assert (await compare(telemetry, scenario)).kind is None
    parent = the_litellm_span(telemetry, False)
    (attempt,) = telemetry.requests()
    assert attempt.name == "POST /api/chat"
    assert attempt.parent is not None and parent.context is not None
    assert attempt.parent.span_id == parent.context.span_id
    assert attributes(attempt)["llm_latency.stream.events"] == TOKENS + 1  # and the done line
    assert_no_request_id(attempt)
    assert_phases(telemetry, attempt)


# -- langchain-openai ---------------------------------------------------------------------------


def chat_model(server: RunningServer, **extra: Any) -> ChatOpenAI:
    return ChatOpenAI(base_url=server.url("/v1"), api_key=SecretStr("sk-langchain"), model="gpt-test",
                      **extra)  # fmt: skip


@pytest.mark.parametrize("is_async", [False, True], ids=["invoke", "ainvoke"])
async def test_langchain_invoke_with_max_retries(
    telemetry: Telemetry, server: RunningServer, is_async: bool
) -> None:
    """ChatOpenAI runs on the openai SDK: its ``max_retries`` is the SDK's, and the SDK call is
    the one logical parent of the attempts."""
    model = chat_model(server, max_retries=2)

    async def scenario() -> None:
        server.state.rate_limit_next = 1
        answer = await call(
            is_async, (lambda: model.ainvoke("hi")) if is_async else (lambda: model.invoke("hi"))
        )
        assert answer.content == ANSWER

    assert (await compare(telemetry, scenario)).kind is None
    (parent,) = named(telemetry, "openai ")
    assert parent.name == "openai chat.completions"
    attempts = assert_grouped_retries(telemetry, parent, [429, 200])
    for attempt in attempts:
        assert attempt.name == "POST /v1/chat/completions"
        assert attributes(attempt)["http.response.header.x-request-id"][0].startswith("req_")
        assert_phases(telemetry, attempt)
    assert attributes(attempts[-1])["llm_latency.server.processing_time"] >= TTFB - EARLY


async def test_langchain_stream(telemetry: Telemetry, server: RunningServer) -> None:
    model = chat_model(server)

    async def scenario() -> None:
        text = await asyncio.to_thread(lambda: "".join(str(c.content) for c in model.stream("hi")))
        assert text == ANSWER

    assert (await compare(telemetry, scenario)).kind is None
    (parent,) = named(telemetry, "openai ")
    (attempt,) = telemetry.requests()
    attrs = attributes(attempt)
    assert attrs["http.response.header.x-request-id"][0].startswith("req_")
    assert attrs["gen_ai.response.time_to_first_chunk"] >= TTFB - EARLY
    # A chunk per token, the finish chunk, (the usage chunk when ChatOpenAI asks for it), [DONE].
    usage = 1 if model.stream_usage else 0
    assert attrs["llm_latency.stream.events"] == TOKENS + 2 + usage
    assert (parent.end_time or 0) >= (attempt.end_time or 0)
    assert_phases(telemetry, attempt)


# -- ollama -------------------------------------------------------------------------------------

OLLAMA_CASES = [
    ("sync", "chat"), ("sync", "generate"), ("async", "chat"), ("async", "generate")
]  # fmt: skip


def ollama_text(kind: str, part: Any) -> str:
    return str(part.message.content if kind == "chat" else part.response)


def ollama_request(server: RunningServer, mode: str, kind: str, stream: bool) -> Any:
    """The call, and how to read its answer to the end."""
    client: Any = (ollama.AsyncClient if mode == "async" else ollama.Client)(host=server.url(""))
    method = getattr(client, kind)
    kwargs: dict[str, Any] = {"model": "llama-test", "stream": stream}
    kwargs.update({"messages": MESSAGES} if kind == "chat" else {"prompt": "hi"})
    if mode == "async":

        async def read_async() -> str:
            answer = await method(**kwargs)
            if not stream:
                return ollama_text(kind, answer)
            return "".join([ollama_text(kind, part) async for part in answer])

        return read_async()

    def read() -> str:
        answer = method(**kwargs)
        return (
            "".join(ollama_text(kind, p) for p in answer) if stream else ollama_text(kind, answer)
        )

    return asyncio.to_thread(read)


@pytest.mark.parametrize(("mode", "kind"), OLLAMA_CASES)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_ollama(
    telemetry: Telemetry, server: RunningServer, mode: str, kind: str, stream: bool
) -> None:
    async def scenario() -> None:
        assert await ollama_request(server, mode, kind, stream) == ANSWER

    assert (await compare(telemetry, scenario)).kind is None
    (attempt,) = telemetry.requests()
    assert attempt.name == f"POST /api/{kind}"
    # The client does not retry: no logical parent is added.
    assert attempt.parent is None
    assert len(telemetry.spans()) == 1 + len(telemetry.phases(attempt))
    attrs = attributes(attempt)
    assert_no_request_id(attempt)
    assert "llm_latency.server.processing_time" not in attrs
    if stream:
        # One NDJSON line per token and the done line.
        assert attrs["llm_latency.stream.events"] == TOKENS + 1
        assert attrs["gen_ai.response.time_to_first_chunk"] >= TTFB - EARLY
    else:
        assert "llm_latency.stream.events" not in attrs
    assert_phases(telemetry, attempt)


async def test_ollama_rate_limited_is_one_attempt(
    telemetry: Telemetry, server: RunningServer
) -> None:
    async def scenario() -> None:
        server.state.rate_limit_next = 1
        await ollama.AsyncClient(host=server.url("")).chat(model="llama-test", messages=MESSAGES)

    outcome = await compare(telemetry, scenario)
    assert outcome.kind is ollama.ResponseError
    (attempt,) = telemetry.requests()
    assert attempt.name == "POST /api/chat"
    assert attributes(attempt)["http.response.status_code"] == 429
    assert attributes(attempt)["error.type"] == "429"
    assert named(telemetry, "retry.backoff") == []
    assert_no_request_id(attempt)


# -- hooking --------------------------------------------------------------------------------------


#: How long the program of test_litellm_imported_after_instrument may take (s). It needs about
#: 4 s of CPU, litellm's import 3.2 s of it (the same with and without instrument()); beside two
#: CPU burners (load 13) it took 15 to 41 s, and more than 90 s in a loaded fresh-clone CI run
#: (load 16 on 2 cores). Nothing here is about speed: the budget only ends a hung program.
LAZY_LITELLM_BUDGET = 300


@pytest.mark.timeout(LAZY_LITELLM_BUDGET + 60)
async def test_litellm_imported_after_instrument(server: RunningServer) -> None:
    """The order a program has: instrument() imports neither litellm nor openai; importing
    litellm hooks both (openai first, inside litellm's import), and the call still groups."""
    program = Path(__file__).parent / "programs" / "lazy_litellm.py"
    server.state.rate_limit_next = 2
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(program), server.url("/v1"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), LAZY_LITELLM_BUDGET)
    assert process.returncode == 0, err.decode()
    assert out.decode().splitlines() == [
        "OK imported by instrument(): []",
        "OK parents: ['litellm completion']",
        "OK under it: [429, 'retry.backoff', 429, 'retry.backoff', 200]",
    ]


def test_uninstrument_puts_litellm_back() -> None:
    """After uninstrument(), litellm's functions and the SDK's request are the originals."""
    import litellm.main
    import openai._base_client as openai_base

    hooked = [(litellm, "completion"), (litellm, "acompletion"), (litellm.main, "completion"),
              (litellm.main, "acompletion"), (openai_base.BaseClient, "_build_request")]  # fmt: skip
    before = [vars(owner)[name] for owner, name in hooked]
    telemetry = Telemetry()
    telemetry.instrument()
    try:
        during = [vars(owner)[name] for owner, name in hooked]
        assert all(
            hasattr(d, "__wrapped__") and d is not b for d, b in zip(during, before, strict=True)
        )
    finally:
        llm_latency.uninstrument()
    assert [vars(owner)[name] for owner, name in hooked] == before


async def test_litellm_outer_retry_wait_is_a_backoff(
    telemetry: Telemetry, server: RunningServer
) -> None:
    """``acompletion(num_retries=2)`` against four 429s: the SDK's three attempts, then
    litellm's own tries; before its second one litellm waits (tenacity's exponential wait for a
    rate limit, 1 s first): that wait is a ``retry.backoff`` of the call as long as it was."""

    async def scenario() -> None:
        server.state.rate_limit_next = 4
        answer = await litellm.acompletion(**litellm_openai(server, num_retries=2))
        assert answer.choices[0].message.content == ANSWER

    assert (await compare(telemetry, scenario)).kind is None
    parent = the_litellm_span(telemetry, True)
    assert_grouped_retries(telemetry, parent, [429, 429, 429, 429, 200])
    backoffs = [s for s in children(telemetry, parent) if s.name == "retry.backoff"]
    assert seconds(backoffs[-1]) >= 1.0 - EARLY
