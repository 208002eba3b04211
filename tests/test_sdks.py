"""The real openai and anthropic SDKs, sync and async, streamed and not, against a loopback
provider-compatible server: one request span per attempt, with the provider's facts."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from dirty_equals import IsFloat
from openai.types.chat import ChatCompletionMessageParam
from opentelemetry.sdk.trace import ReadableSpan

from tests.conftest import Telemetry, seconds
from tests.provider_api import (
    PROMPT_TOKENS,
    TOKEN_GAP,
    TOKENS,
    WAIT,
    ProviderServer,
    provider_server,
)
from tests.span_tree import phase_nodes, span_tree

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
OPENAI_KEY = "sk-openai-secret-key-4242"
ANTHROPIC_KEY = "sk-ant-secret-key-4343"


@pytest.fixture
async def provider() -> AsyncIterator[ProviderServer]:
    async with provider_server() as server:
        yield server


async def call(is_async: bool, work: Callable[[], Any]) -> Any:
    """Run an SDK call: awaited for async clients, in a thread for sync ones."""
    if is_async:
        return await work()
    return await asyncio.to_thread(work)


def attributes(span: ReadableSpan) -> dict[str, Any]:
    assert span.attributes is not None
    return dict(span.attributes)


# Attribute groups of the expected trees, by what they come from.


def post_to(path: str) -> dict[str, Any]:
    """An attempt's attributes that come from its request: a POST to the provider's ``path``."""
    return {
        "http.request.method": "POST",
        "network.peer.address": "127.0.0.1",
        "network.protocol.version": "1.1",
        "server.address": "127.0.0.1",
        "server.port": "PORT",
        "url.full": f"http://127.0.0.1:PORT{path}",
        "url.template": path,
    }


#: What the provider's chat completion adds to its attempt: its headers, and what they tell.
OPENAI_ANSWER = {
    "http.response.header.openai-model": ["gpt-test"],
    "http.response.header.openai-processing-ms": ["50"],
    "http.response.header.x-ratelimit-limit-requests": ["100"],
    "http.response.header.x-ratelimit-remaining-requests": ["99"],
    "http.response.header.x-ratelimit-remaining-tokens": ["5000"],
    "http.response.header.x-ratelimit-reset-requests": ["600ms"],
    "http.response.header.x-request-id": ["req_openai_1"],
    "llm_latency.request_id": "req_openai_1",
    "http.response.status_code": 200,
    "llm_latency.network_overhead": IsFloat(ge=0),
    "llm_latency.server.processing_time": WAIT,
}
#: What the provider's message adds to its attempt (its request id is ``request-id`` only).
ANTHROPIC_ANSWER = {
    "http.response.header.anthropic-ratelimit-requests-remaining": ["49"],
    "http.response.header.request-id": ["req_anthropic_1"],
    "llm_latency.request_id": "req_anthropic_1",
    "http.response.header.x-ratelimit-remaining-requests": ["49"],
    "http.response.status_code": 200,
}
#: What an answer's spans (the attempt's and the call's) say of its tokens: the server's
#: counts, its model, and the times measured.
OPENAI_TOKENS = {
    "gen_ai.response.model": "gpt-test",
    "gen_ai.usage.input_tokens": PROMPT_TOKENS,
    "gen_ai.usage.output_tokens": len(TOKENS),
    "llm_latency.server.time_per_output_token_max": pytest.approx(WAIT / len(TOKENS)),
}
#: A stream without include_usage: its first token is seen, its token count is unknown.
OPENAI_STREAM_TOKENS = {
    "gen_ai.response.model": "gpt-test",
    "llm_latency.time_to_first_token": IsFloat(ge=WAIT - 0.005),
    "llm_latency.usage.unknown": True,
}
ANTHROPIC_TOKENS = {
    "gen_ai.provider.name": "anthropic",
    "gen_ai.response.model": "claude-test",
    "gen_ai.usage.input_tokens": PROMPT_TOKENS,
    "gen_ai.usage.output_tokens": len(TOKENS),
}
ANTHROPIC_STREAM_TOKENS = {
    **ANTHROPIC_TOKENS,
    "llm_latency.time_to_first_token": IsFloat(ge=WAIT - 0.005),
    # Not bounded below on its own: a first token the program read late (a loaded machine)
    # leaves the others to come faster after it. The stream's end is bounded (the test).
    "llm_latency.time_per_output_token": IsFloat(gt=0),
}
#: What the provider's 429 adds to its attempt, for either SDK.
RATE_LIMITED = {
    "error.type": "429",
    "http.response.header.request-id": ["req_429"],
    "llm_latency.request_id": "req_429",
    "http.response.header.retry-after": ["1"],
    "http.response.header.retry-after-ms": ["150"],
    "http.response.header.x-request-id": ["req_429"],
    "http.response.header.x-should-retry": ["true"],
    "http.response.status_code": 429,
}
#: The wait the SDKs make after the provider's 429.
BACKOFF = {
    "name": "retry.backoff",
    "kind": "INTERNAL",
    "attributes": {"llm_latency.backoff.reason": "429", "llm_latency.backoff.retry_after": 0.15},
}
NEW_CONNECTION = phase_nodes("connect", "send", "wait", "receive")
REUSED = phase_nodes("send", "wait", "receive")


def event_loop_lag(is_async: bool) -> dict[str, Any]:
    """An attempt made on an event loop carries the loop's lag."""
    return {"llm_latency.event_loop.lag": IsFloat()} if is_async else {}


def openai_client(provider: ProviderServer, is_async: bool, **kwargs: Any) -> Any:
    factory = openai.AsyncOpenAI if is_async else openai.OpenAI
    return factory(base_url=provider.openai_base, api_key=OPENAI_KEY, **kwargs)


def anthropic_client(provider: ProviderServer, is_async: bool, **kwargs: Any) -> Any:
    factory = anthropic.AsyncAnthropic if is_async else anthropic.Anthropic
    return factory(base_url=provider.anthropic_base, api_key=ANTHROPIC_KEY, **kwargs)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_openai_chat_completion(
    telemetry: Telemetry, provider: ProviderServer, is_async: bool
) -> None:
    client = openai_client(provider, is_async)
    completion = await call(
        is_async, lambda: client.chat.completions.create(model="gpt-test", messages=MESSAGES)
    )
    assert completion.choices[0].message.content == "".join(TOKENS)
    # One attempt, no resend, with the provider's facts from its headers.
    assert span_tree(telemetry.spans()) == [
        {
            "name": "openai chat.completions",
            "kind": "INTERNAL",
            "attributes": {
                **OPENAI_TOKENS,
                "llm_latency.request_id": "req_openai_1",
                "llm_latency.attempts": 1,
                "llm_latency.sdk": "openai",
            },
            "children": [
                {
                    "name": "POST /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        **post_to("/v1/chat/completions"),
                        **OPENAI_ANSWER,
                        **OPENAI_TOKENS,
                        **event_loop_lag(is_async),
                        "llm_latency.connection.reused": False,
                    },
                    "children": NEW_CONNECTION,
                }
            ],
        }
    ]
    assert seconds(telemetry.phases(telemetry.request())["wait"]) >= WAIT - 0.005


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_openai_streamed_completion(
    telemetry: Telemetry, provider: ProviderServer, is_async: bool
) -> None:
    client = openai_client(provider, is_async)

    def consume() -> Any:
        stream = client.chat.completions.create(model="gpt-test", messages=MESSAGES, stream=True)
        if is_async:

            async def read() -> list[str]:
                return [c.choices[0].delta.content async for c in await stream]

            return read()
        return [chunk.choices[0].delta.content for chunk in stream]

    tokens = await call(is_async, consume)
    assert tokens == TOKENS
    assert span_tree(telemetry.spans()) == [
        {
            "name": "openai chat.completions",
            "kind": "INTERNAL",
            "attributes": {
                **OPENAI_STREAM_TOKENS,
                "llm_latency.attempts": 1,
                "llm_latency.request_id": "req_openai_1",
                "llm_latency.sdk": "openai",
            },
            "children": [
                {
                    "name": "POST /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        **post_to("/v1/chat/completions"),
                        **OPENAI_ANSWER,
                        **OPENAI_STREAM_TOKENS,
                        **event_loop_lag(is_async),
                        "gen_ai.response.time_to_first_chunk": IsFloat(),
                        "llm_latency.connection.reused": False,
                        "llm_latency.stream.events": len(TOKENS) + 1,  # and [DONE]
                        "llm_latency.stream.max_gap": IsFloat(),
                        "llm_latency.stream.mean_interval": IsFloat(),
                        "llm_latency.stream.chunk_rate": IsFloat(),
                    },
                    "children": NEW_CONNECTION,
                }
            ],
        }
    ]
    request = telemetry.request()
    attrs = attributes(request)
    assert attrs["gen_ai.response.time_to_first_chunk"] >= WAIT - 0.005
    # The longest gap leaves out what a late loop (a loaded machine) held a chunk back.
    lag = attrs.get("llm_latency.event_loop.lag", 0.0)
    assert attrs["llm_latency.stream.max_gap"] + lag >= TOKEN_GAP - 0.005
    # The span lasts to the end of the stream, not to the headers.
    assert seconds(request) >= WAIT + (len(TOKENS) - 1) * TOKEN_GAP - 0.005


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_openai_retry_after_429(
    telemetry: Telemetry, provider: ProviderServer, is_async: bool
) -> None:
    client = openai_client(provider, is_async, max_retries=2)
    headers = {"x-test-scenario": f"openai-{is_async}", "x-test-fail": "1"}
    await call(
        is_async,
        lambda: client.chat.completions.create(
            model="gpt-test", messages=MESSAGES, extra_headers=headers
        ),
    )
    # The whole trace: the SDK call's span, and under it the two attempts (with their phases)
    # and the wait between them. Async attempts also carry their event loop's lag.
    tree = span_tree(telemetry.spans())
    lag = {"llm_latency.event_loop.lag": IsFloat()} if is_async else {}
    assert tree == [
        {
            "name": "openai chat.completions",
            "kind": "INTERNAL",
            "attributes": {
                **OPENAI_TOKENS,
                "llm_latency.request_id": "req_openai_1",
                "llm_latency.attempts": 2,
                "llm_latency.sdk": "openai",
            },
            "children": [
                {
                    "name": "POST /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        "error.type": "429",
                        "http.request.method": "POST",
                        "http.response.header.request-id": ["req_429"],
                        "llm_latency.request_id": "req_429",
                        "http.response.header.retry-after": ["1"],
                        "http.response.header.retry-after-ms": ["150"],
                        "http.response.header.x-request-id": ["req_429"],
                        "http.response.header.x-should-retry": ["true"],
                        "http.response.status_code": 429,
                        "llm_latency.connection.reused": False,
                        **lag,
                        "network.peer.address": "127.0.0.1",
                        "network.protocol.version": "1.1",
                        "server.address": "127.0.0.1",
                        "server.port": "PORT",
                        "url.full": "http://127.0.0.1:PORT/v1/chat/completions",
                        "url.template": "/v1/chat/completions",
                    },
                    "children": phase_nodes("connect", "send", "wait", "receive"),
                },
                {
                    "name": "retry.backoff",
                    "kind": "INTERNAL",
                    "attributes": {
                        "llm_latency.backoff.reason": "429",
                        "llm_latency.backoff.retry_after": 0.15,
                    },
                },
                {
                    "name": "POST /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        "http.request.method": "POST",
                        "http.request.resend_count": 1,
                        "http.response.header.openai-model": ["gpt-test"],
                        **OPENAI_TOKENS,
                        "http.response.header.openai-processing-ms": ["50"],
                        "http.response.header.x-ratelimit-limit-requests": ["100"],
                        "http.response.header.x-ratelimit-remaining-requests": ["99"],
                        "http.response.header.x-ratelimit-remaining-tokens": ["5000"],
                        "http.response.header.x-ratelimit-reset-requests": ["600ms"],
                        "http.response.header.x-request-id": ["req_openai_1"],
                        "llm_latency.request_id": "req_openai_1",
                        "http.response.status_code": 200,
                        "llm_latency.connection.reused": True,
                        **lag,
                        "llm_latency.network_overhead": IsFloat(ge=0),
                        "llm_latency.server.processing_time": 0.05,
                        "network.peer.address": "127.0.0.1",
                        "network.protocol.version": "1.1",
                        "server.address": "127.0.0.1",
                        "server.port": "PORT",
                        "url.full": "http://127.0.0.1:PORT/v1/chat/completions",
                        "url.template": "/v1/chat/completions",
                    },
                    "children": phase_nodes("send", "wait", "receive"),
                },
            ],
        }
    ]
    limited, ok = sorted(telemetry.requests(), key=lambda s: s.start_time or 0)
    # The SDK waited as the server asked before the second attempt.
    assert (ok.start_time or 0) - (limited.end_time or 0) >= 0.15e9 - 5e6
    (limited_count,) = telemetry.metric_points("llm_latency.rate_limited")
    assert limited_count.value == 1


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_anthropic_messages(
    telemetry: Telemetry, provider: ProviderServer, is_async: bool
) -> None:
    client = anthropic_client(provider, is_async)
    message = await call(
        is_async,
        lambda: client.messages.create(model="claude-test", max_tokens=16, messages=MESSAGES),
    )
    assert message.content[0].text == "".join(TOKENS)
    assert span_tree(telemetry.spans()) == [
        {
            "name": "anthropic messages",
            "kind": "INTERNAL",
            "attributes": {
                **ANTHROPIC_TOKENS,
                "llm_latency.attempts": 1,
                "llm_latency.request_id": "req_anthropic_1",
                "llm_latency.sdk": "anthropic",
            },
            "children": [
                {
                    "name": "POST /v1/messages",
                    "kind": "CLIENT",
                    "attributes": {
                        **post_to("/v1/messages"),
                        **ANTHROPIC_ANSWER,
                        **ANTHROPIC_TOKENS,
                        **event_loop_lag(is_async),
                        "llm_latency.connection.reused": False,
                    },
                    "children": NEW_CONNECTION,
                }
            ],
        }
    ]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_anthropic_streamed_message(
    telemetry: Telemetry, provider: ProviderServer, is_async: bool
) -> None:
    client = anthropic_client(provider, is_async)
    kwargs = {"model": "claude-test", "max_tokens": 16, "messages": MESSAGES}

    def consume() -> Any:
        if is_async:

            async def read() -> str:
                async with client.messages.stream(**kwargs) as stream:
                    return "".join([text async for text in stream.text_stream])

            return read()
        with client.messages.stream(**kwargs) as stream:
            return "".join(stream.text_stream)

    assert await call(is_async, consume) == "".join(TOKENS)
    assert span_tree(telemetry.spans()) == [
        {
            "name": "anthropic messages",
            "kind": "INTERNAL",
            "attributes": {
                **ANTHROPIC_STREAM_TOKENS,
                "llm_latency.attempts": 1,
                "llm_latency.request_id": "req_anthropic_1",
                "llm_latency.sdk": "anthropic",
            },
            "children": [
                {
                    "name": "POST /v1/messages",
                    "kind": "CLIENT",
                    "attributes": {
                        **post_to("/v1/messages"),
                        **ANTHROPIC_ANSWER,
                        **ANTHROPIC_STREAM_TOKENS,
                        **event_loop_lag(is_async),
                        "gen_ai.response.time_to_first_chunk": IsFloat(),
                        "llm_latency.connection.reused": False,
                        # message_start, content_block_start, a delta per token,
                        # content_block_stop, message_delta, message_stop
                        "llm_latency.stream.events": len(TOKENS) + 5,
                        "llm_latency.stream.max_gap": IsFloat(),
                        "llm_latency.stream.mean_interval": IsFloat(),
                        "llm_latency.stream.chunk_rate": IsFloat(),
                    },
                    "children": NEW_CONNECTION,
                }
            ],
        }
    ]
    attrs = attributes(telemetry.request())
    assert attrs["gen_ai.response.time_to_first_chunk"] >= WAIT - 0.005
    # The first token, then the others one time per output token apart: the end of the
    # stream, which cannot come before the server sent its last token.
    first, per_token = (
        attrs["llm_latency.time_to_first_token"],
        attrs["llm_latency.time_per_output_token"],
    )
    assert first + (len(TOKENS) - 1) * per_token >= WAIT + (len(TOKENS) - 1) * TOKEN_GAP - 0.005
    assert first + (len(TOKENS) - 1) * per_token <= seconds(telemetry.request()) + 1e-6


async def test_anthropic_retry_after_429(telemetry: Telemetry, provider: ProviderServer) -> None:
    client = anthropic_client(provider, True, max_retries=2)
    headers = {"x-test-scenario": "anthropic", "x-test-fail": "2"}
    await client.messages.create(
        model="claude-test", max_tokens=16, messages=MESSAGES, extra_headers=headers
    )
    lag = event_loop_lag(True)
    assert span_tree(telemetry.spans()) == [
        {
            "name": "anthropic messages",
            "kind": "INTERNAL",
            "attributes": {
                **ANTHROPIC_TOKENS,
                "llm_latency.attempts": 3,
                "llm_latency.request_id": "req_anthropic_1",
                "llm_latency.sdk": "anthropic",
            },
            "children": [
                {
                    "name": "POST /v1/messages",
                    "kind": "CLIENT",
                    "attributes": {
                        **post_to("/v1/messages"),
                        **RATE_LIMITED,
                        **lag,
                        "llm_latency.connection.reused": False,
                    },
                    "children": NEW_CONNECTION,
                },
                BACKOFF,
                {
                    "name": "POST /v1/messages",
                    "kind": "CLIENT",
                    "attributes": {
                        **post_to("/v1/messages"),
                        **RATE_LIMITED,
                        **lag,
                        "http.request.resend_count": 1,
                        "llm_latency.connection.reused": True,
                    },
                    "children": REUSED,
                },
                BACKOFF,
                {
                    "name": "POST /v1/messages",
                    "kind": "CLIENT",
                    "attributes": {
                        **post_to("/v1/messages"),
                        **ANTHROPIC_ANSWER,
                        **ANTHROPIC_TOKENS,
                        **lag,
                        "http.request.resend_count": 2,
                        "llm_latency.connection.reused": True,
                    },
                    "children": REUSED,
                },
            ],
        }
    ]


async def test_openai_aiohttp_backend_one_span_per_attempt(
    telemetry: Telemetry, provider: ProviderServer
) -> None:
    async with openai.AsyncOpenAI(
        base_url=provider.openai_base,
        api_key=OPENAI_KEY,
        http_client=openai.DefaultAioHttpClient(),
    ) as client:
        headers = {"x-test-scenario": "aiohttp-backend", "x-test-fail": "1"}
        await client.chat.completions.create(
            model="gpt-test", messages=MESSAGES, extra_headers=headers
        )
    # aiohttp in place of httpx: the same trace as with the SDK's default client.
    lag = event_loop_lag(True)
    assert span_tree(telemetry.spans()) == [
        {
            "name": "openai chat.completions",
            "kind": "INTERNAL",
            "attributes": {
                **OPENAI_TOKENS,
                "llm_latency.request_id": "req_openai_1",
                "llm_latency.attempts": 2,
                "llm_latency.sdk": "openai",
            },
            "children": [
                {
                    "name": "POST /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        **post_to("/v1/chat/completions"),
                        **RATE_LIMITED,
                        **lag,
                        "llm_latency.connection.reused": False,
                    },
                    "children": NEW_CONNECTION,
                },
                BACKOFF,
                {
                    "name": "POST /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        **post_to("/v1/chat/completions"),
                        **OPENAI_ANSWER,
                        **OPENAI_TOKENS,
                        **lag,
                        "http.request.resend_count": 1,
                        "llm_latency.connection.reused": True,
                    },
                    "children": REUSED,
                },
            ],
        }
    ]


async def test_api_keys_never_exported(telemetry: Telemetry, provider: ProviderServer) -> None:
    await openai_client(provider, True).chat.completions.create(model="m", messages=MESSAGES)
    await anthropic_client(provider, True).messages.create(
        model="c", max_tokens=4, messages=MESSAGES
    )
    sent = " ".join(str(h) for h in provider.seen_headers)
    assert f"Bearer {OPENAI_KEY}" in sent
    assert ANTHROPIC_KEY in sent
    spans = "".join(span.to_json() for span in telemetry.spans())
    data = telemetry.reader.get_metrics_data()
    exported = spans + (data.to_json() if data is not None else "")
    assert len(telemetry.requests()) == 2
    assert OPENAI_KEY not in exported
    assert ANTHROPIC_KEY not in exported


async def test_instrument_imports_nothing_and_hooks_sdks_when_imported(
    provider: ProviderServer,
) -> None:
    """instrument() does not import the SDKs (more than a second and thousands of modules) nor
    the clients: each is hooked when the program imports it."""
    program = Path(__file__).parent / "programs" / "lazy_sdk.py"
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(program), provider.openai_base,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    assert out.decode().splitlines() == [
        "OK imported by instrument(): []",
        "OK openai chat.completions > POST /v1/chat/completions",
        "OK anthropic hooked after uninstrument(): False",
    ]


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/chat/completions", "chat.completions"),  # openai: the base URL holds /v1
        ("/v1/messages/count_tokens", "messages.count_tokens"),
        ("/openai/v1/chat/completions", "chat.completions"),  # groq: before the version goes
        ("/v1beta/models/{model}:streamGenerateContent", "models.streamGenerateContent"),
        ("/v1/models/gemini-2.0-flash:generateContent?alt=sse", "models.generateContent"),
        ("/v1/responses/resp_68a1c2/cancel", "responses.cancel"),  # ids make no names
    ],
)
def test_a_call_span_is_named_after_the_resource_not_the_route(path: str, name: str) -> None:
    """A call's span reads as the SDK call (``openai chat.completions``), never as one of its
    attempts (``POST /v1/chat/completions``), and ids in the path add no names."""
    from llm_latency.adapters.sdks import resource

    assert resource(path) == name
