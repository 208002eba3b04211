"""Retries made visible: every attempt its own span, each wait a ``retry.backoff`` span, all under
one logical parent, for the SDKs' own retries and urllib3's. (The ``llm_latency.retry`` helper's
are in tests/test_retry_helper.py, which shares the attribute groups here.)"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
import requests
import urllib3
from dirty_equals import IsFloat
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind
from requests.adapters import HTTPAdapter
from urllib3.util import Retry

from tests.conftest import Telemetry, seconds
from tests.provider_api import PROMPT_TOKENS, TOKENS, ProviderServer, provider_server
from tests.servers import LLMServer
from tests.span_tree import phase_nodes, span_tree

_scenarios = itertools.count()


def scenario(server: LLMServer, fail: int, fail_with: str = "429", **query: Any) -> str:
    """A URL whose first ``fail`` attempts fail as ``fail_with`` (a status, or "reset")."""
    return server.url(scenario=f"s{next(_scenarios)}", fail=fail, fail_with=fail_with, **query)


def children(telemetry: Telemetry, parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return sorted(
        (s for s in telemetry.spans() if s.parent and s.parent.span_id == parent.context.span_id),
        key=lambda s: s.start_time or 0,
    )


def by_name(telemetry: Telemetry, name: str) -> ReadableSpan:
    (span,) = [s for s in telemetry.spans() if s.name == name]
    return span


def attrs(span: ReadableSpan) -> dict[str, Any]:
    assert span.attributes is not None
    return dict(span.attributes)


def assert_one_after_another(telemetry: Telemetry, parent: str) -> list[ReadableSpan]:
    """The children of the span named ``parent`` do not overlap: each wait lies between the
    attempt before it and the one after it. Returns the waits."""
    spans = children(telemetry, by_name(telemetry, parent))
    for before, after in itertools.pairwise(spans):
        assert (before.end_time or 0) <= (after.start_time or 0), (before.name, after.name)
    return [s for s in spans if s.name == "retry.backoff"]


def assert_attempts_and_waits(
    telemetry: Telemetry, parent: ReadableSpan, reasons: list[str]
) -> list[ReadableSpan]:
    """Under ``parent``: attempt, wait, attempt, ... with resend counts 0, 1, ... and each wait
    between the attempt before it and the one after it. Returns the waits. (For the SDKs whose
    tests check the shape only; the tests here state the whole tree.)"""
    spans = children(telemetry, parent)
    kinds = ["attempt" if s.kind is SpanKind.CLIENT else s.name for s in spans]
    expected = ["attempt"] + ["retry.backoff", "attempt"] * len(reasons)
    assert kinds == expected
    attempts, waits = spans[0::2], spans[1::2]
    assert [attrs(a).get("http.request.resend_count", 0) for a in attempts] == list(
        range(len(attempts))
    )
    for before, wait, after in zip(attempts, waits, attempts[1:], strict=False):
        assert (before.end_time or 0) <= (wait.start_time or 0)
        assert (wait.end_time or 0) <= (after.start_time or 0)
    assert [attrs(w)["llm_latency.backoff.reason"] for w in waits] == reasons
    return waits


# Attribute groups of the expected trees, by what they come from.

PATH = "/v1/chat/completions"


def request_to(method: str, url: str) -> dict[str, Any]:
    """An attempt's attributes that come from its request to the test server's ``url``."""
    return {
        "http.request.method": method,
        "network.peer.address": "127.0.0.1",  # the test servers listen there only
        "server.address": "127.0.0.1",
        "server.port": "PORT",
        "url.full": re.sub(r":\d+/", ":PORT/", url, count=1),
        "url.template": PATH,
    }


#: What the test server's successful answer adds to its attempt: its headers, and what they tell.
SERVED = {
    "http.response.header.openai-processing-ms": ["0"],
    "http.response.header.x-ratelimit-remaining-requests": ["42"],
    "http.response.header.x-ratelimit-remaining-tokens": ["9000"],
    "http.response.header.x-request-id": ["req_test_123"],
    "llm_latency.request_id": "req_test_123",
    "llm_latency.network_overhead": IsFloat(ge=0),
    "llm_latency.server.processing_time": 0.0,
}


def served(
    method: str, url: str, *, reused: bool, processing: float = 0.0, host: str = "127.0.0.1"
) -> dict[str, Any]:
    """The attributes of an attempt the test server answered (``processing``: the wait it was
    asked for, which it reports as its own time)."""
    return {
        **request_to(method, url),
        **SERVED,
        "http.response.header.openai-processing-ms": [f"{processing * 1000:.0f}"],
        "http.response.status_code": 200,
        "llm_latency.connection.reused": reused,
        "llm_latency.server.processing_time": processing,
        "network.protocol.version": "1.1",
        "server.address": host,
    }


def redirect_hops(server: LLMServer, lag: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The attempts of a GET of the test server's ``/redirect``: the 302 on a new connection,
    then the answer, a resend on the same connection (``lag``: on an event loop, its lag)."""
    return [
        {
            "name": "GET",
            "kind": "CLIENT",
            "attributes": {
                **(lag or {}),
                "http.request.method": "GET",
                "http.response.status_code": 302,
                "llm_latency.connection.reused": False,
                "network.peer.address": "127.0.0.1",
                "network.protocol.version": "1.1",
                "server.address": "127.0.0.1",
                "server.port": "PORT",
                "url.full": "http://127.0.0.1:PORT/redirect",
            },
            "children": NEW_CONNECTION,
        },
        {
            "name": "GET /v1/chat/completions",
            "kind": "CLIENT",
            "attributes": {
                **served("GET", server.url(), reused=True),
                **(lag or {}),
                "http.request.resend_count": 1,
            },
            "children": REUSED,
        },
    ]


#: What the provider's 429 adds to its attempt.
PROVIDER_429 = {
    "http.response.header.request-id": ["req_429"],
    "llm_latency.request_id": "req_429",
    "http.response.header.retry-after": ["1"],
    "http.response.header.retry-after-ms": ["150"],
    "http.response.header.x-request-id": ["req_429"],
    "http.response.header.x-should-retry": ["true"],
}
#: What the provider's chat completion adds to its attempt.
PROVIDER_SERVED = {
    "http.response.header.openai-model": ["gpt-test"],
    "http.response.header.openai-processing-ms": ["50"],
    "http.response.header.x-ratelimit-limit-requests": ["100"],
    "http.response.header.x-ratelimit-remaining-requests": ["99"],
    "http.response.header.x-ratelimit-remaining-tokens": ["5000"],
    "http.response.header.x-ratelimit-reset-requests": ["600ms"],
    "http.response.header.x-request-id": ["req_openai_1"],
    "llm_latency.request_id": "req_openai_1",
    "llm_latency.network_overhead": IsFloat(ge=0),
    "llm_latency.server.processing_time": 0.05,
}


def provider_tokens(model: str) -> dict[str, Any]:
    """What the provider's chat completion says of its tokens (on the attempt that answered and
    on llm-latency's span of the call)."""
    return {
        "gen_ai.response.model": model,
        "gen_ai.usage.input_tokens": PROMPT_TOKENS,
        "gen_ai.usage.output_tokens": len(TOKENS),
        "llm_latency.server.time_per_output_token_max": pytest.approx(0.05 / len(TOKENS)),
    }


#: An attempt made on an event loop carries the loop's lag.
LAG = {"llm_latency.event_loop.lag": IsFloat()}
NEW_CONNECTION = phase_nodes("connect", "send", "wait", "receive")
REUSED = phase_nodes("send", "wait", "receive")


# -- the SDKs' own retries, and urllib3's ---------------------------------------------------------


@pytest.fixture
async def provider() -> AsyncIterator[ProviderServer]:
    async with provider_server() as server:
        yield server


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_openai_retries_grouped_under_one_parent(
    telemetry: Telemetry, provider: ProviderServer, is_async: bool
) -> None:
    factory = openai.AsyncOpenAI if is_async else openai.OpenAI
    client: Any = factory(base_url=provider.openai_base, api_key="sk-test", max_retries=3)
    headers = {"x-test-scenario": f"grouped-{is_async}", "x-test-fail": "2"}

    def call() -> Any:
        return client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], extra_headers=headers
        )

    await (call() if is_async else asyncio.to_thread(call))
    # The program had no span: llm-latency opened the SDK call's, with every attempt and wait
    # under it.
    lag = LAG if is_async else {}
    openai_at = {**request_to("POST", f"{provider.openai_base}/chat/completions"), **lag}
    limited = {**PROVIDER_429, "error.type": "429", "http.response.status_code": 429}
    assert span_tree(telemetry.spans()) == [
        {
            "name": "openai chat.completions",
            "kind": "INTERNAL",
            "attributes": {
                **provider_tokens("m"),
                "llm_latency.attempts": 3,
                "llm_latency.request_id": "req_openai_1",
                "llm_latency.sdk": "openai",
            },
            "children": [
                {
                    "name": "POST /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        **openai_at,
                        **limited,
                        "llm_latency.connection.reused": False,
                        "network.protocol.version": "1.1",
                    },
                    "children": NEW_CONNECTION,
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
                        **openai_at,
                        **limited,
                        "http.request.resend_count": 1,
                        "llm_latency.connection.reused": True,
                        "network.protocol.version": "1.1",
                    },
                    "children": REUSED,
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
                        **openai_at,
                        **PROVIDER_SERVED,
                        **provider_tokens("m"),
                        "http.request.resend_count": 2,
                        "http.response.status_code": 200,
                        "llm_latency.connection.reused": True,
                        "network.protocol.version": "1.1",
                    },
                    "children": REUSED,
                },
            ],
        }
    ]
    assert by_name(telemetry, "openai chat.completions").parent is None
    for wait in assert_one_after_another(telemetry, "openai chat.completions"):
        assert seconds(wait) >= 0.15 - 0.005


async def test_genai_span_is_the_parent_when_present(
    telemetry: Telemetry, provider: ProviderServer
) -> None:
    client = openai.AsyncOpenAI(base_url=provider.openai_base, api_key="sk-test")
    tracer = telemetry.tracer_provider.get_tracer("genai-instrumentation")
    with tracer.start_as_current_span(
        "chat gpt-test", attributes={"gen_ai.operation.name": "chat"}
    ) as genai:
        await client.chat.completions.create(
            model="gpt-test",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-test-scenario": "genai", "x-test-fail": "1"},
        )
    # No span of llm-latency's own: the attempts and the wait are under the GenAI span.
    openai_at = {**request_to("POST", f"{provider.openai_base}/chat/completions"), **LAG}
    assert span_tree(telemetry.spans()) == [
        {
            "name": "chat gpt-test",
            "kind": "INTERNAL",
            "attributes": {"gen_ai.operation.name": "chat"},
            "children": [
                {
                    "name": "POST /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        **openai_at,
                        **PROVIDER_429,
                        "error.type": "429",
                        "http.response.status_code": 429,
                        "llm_latency.connection.reused": False,
                        "network.protocol.version": "1.1",
                    },
                    "children": NEW_CONNECTION,
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
                        **openai_at,
                        **PROVIDER_SERVED,
                        **provider_tokens("gpt-test"),
                        "http.request.resend_count": 1,
                        "http.response.status_code": 200,
                        "llm_latency.connection.reused": True,
                        "network.protocol.version": "1.1",
                    },
                    "children": REUSED,
                },
            ],
        }
    ]
    parent = by_name(telemetry, "chat gpt-test")
    assert parent.context is not None
    assert parent.context.span_id == genai.get_span_context().span_id
    assert_one_after_another(telemetry, "chat gpt-test")


async def test_urllib3_retries_have_backoff_spans(telemetry: Telemetry, server: LLMServer) -> None:
    retries = Retry(total=3, status_forcelist=[503], backoff_factor=0.05, allowed_methods=None)
    url = scenario(server, fail=2, fail_with="503")

    def work() -> int:
        with requests.Session() as session:
            session.mount("http://", HTTPAdapter(max_retries=retries))
            return session.get(url).status_code

    tracer = telemetry.tracer_provider.get_tracer("program")
    with tracer.start_as_current_span("program") as program:
        assert await asyncio.to_thread(lambda: _in_context(program, work)) == 200
    # urllib3 retries inside one urlopen: its attempts and waits are under the program's span.
    unavailable = {"error.type": "503", "http.response.status_code": 503}
    assert span_tree(telemetry.spans()) == [
        {
            "name": "program",
            "kind": "INTERNAL",
            "attributes": {},
            "children": [
                {
                    "name": "GET /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        **request_to("GET", url),
                        **unavailable,
                        "llm_latency.connection.reused": False,
                        "network.protocol.version": "1.1",
                    },
                    "children": NEW_CONNECTION,
                },
                {
                    "name": "retry.backoff",
                    "kind": "INTERNAL",
                    "attributes": {"llm_latency.backoff.reason": "503"},
                },
                {
                    "name": "GET /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        **request_to("GET", url),
                        **unavailable,
                        "http.request.resend_count": 1,
                        "llm_latency.connection.reused": True,
                        "network.protocol.version": "1.1",
                    },
                    "children": REUSED,
                },
                {
                    "name": "retry.backoff",
                    "kind": "INTERNAL",
                    "attributes": {"llm_latency.backoff.reason": "503"},
                },
                {
                    "name": "GET /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        **request_to("GET", url),
                        **SERVED,
                        "http.request.resend_count": 2,
                        "http.response.status_code": 200,
                        "llm_latency.connection.reused": True,
                        "network.protocol.version": "1.1",
                    },
                    "children": REUSED,
                },
            ],
        }
    ]
    assert_one_after_another(telemetry, "program")


def _in_context(span: Any, work: Any) -> Any:
    from opentelemetry import trace

    with trace.use_span(span, end_on_exit=False):
        return work()


async def test_no_backoff_after_a_redirect(telemetry: Telemetry, server: LLMServer) -> None:
    """Two attempts of one call (urllib3 follows the 302 inside one urlopen), the first a
    redirect: the second is no retry, and nothing waited."""

    def work() -> int:
        pool = urllib3.HTTPConnectionPool("127.0.0.1", server.port)
        return int(pool.urlopen("GET", "/redirect", redirect=True).status)

    assert await asyncio.to_thread(work) == 200
    # Two attempts, the second a resend on the same connection, and no wait between them. Each
    # response was read whole as it was built (urllib3's preload_content): its facts are there.
    assert span_tree(telemetry.spans()) == redirect_hops(server)
    assert telemetry.metric_points("llm_latency.retries") == []
