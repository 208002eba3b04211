"""The ``llm_latency.retry`` helper: with each client, every attempt its own span and each wait a
``retry.backoff`` span under the decorated function's; what it retries, how long it waits, and
when it gives up."""

from __future__ import annotations

import asyncio
import email.utils
import time
from typing import Any

import aiohttp
import httpx2
import pytest
import requests
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.trace import StatusCode

import llm_latency
from llm_latency import headers as hdr
from llm_latency.retry import backoff_delay, is_transient, retry
from tests.checks import SLACK
from tests.conftest import Telemetry, seconds
from tests.servers import LLMServer
from tests.span_tree import phase_nodes, span_tree
from tests.test_retries import (
    LAG,
    NEW_CONNECTION,
    REUSED,
    SERVED,
    assert_one_after_another,
    by_name,
    request_to,
    scenario,
)

# -- the helper, with each client ----------------------------------------------------------------


async def test_helper_with_aiohttp_honours_retry_after(
    telemetry: Telemetry, server: LLMServer
) -> None:
    url = scenario(server, fail=2, retry_ms=200)

    @retry(attempts=5, base_delay=0.01)
    async def complete(session: aiohttp.ClientSession) -> Any:
        async with session.post(url, json={}, raise_for_status=True) as response:
            return await response.json()

    async with aiohttp.ClientSession() as session:
        body = await complete(session)
    assert "choices" in body
    # Under the helper's span: attempt, wait, attempt, wait, attempt; each wait as long as the
    # server asked (retry-after-ms), and its reason the status that caused it.
    limited = {"error.type": "429", "http.response.header.retry-after-ms": ["200"]}
    assert span_tree(telemetry.spans()) == [
        {
            "name": "test_helper_with_aiohttp_honours_retry_after.complete",
            "kind": "INTERNAL",
            "attributes": {"llm_latency.attempts": 3, "llm_latency.request_id": "req_test_123"},
            "children": [
                {
                    "name": "POST /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        **request_to("POST", url),
                        **limited,
                        **LAG,
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
                        "llm_latency.backoff.retry_after": 0.2,
                    },
                },
                {
                    "name": "POST /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        **request_to("POST", url),
                        **limited,
                        **LAG,
                        "http.request.resend_count": 1,
                        "http.response.status_code": 429,
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
                        "llm_latency.backoff.retry_after": 0.2,
                    },
                },
                {
                    "name": "POST /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        **request_to("POST", url),
                        **SERVED,
                        **LAG,
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
    for wait in assert_one_after_another(
        telemetry, "test_helper_with_aiohttp_honours_retry_after.complete"
    ):
        assert 0.2 - 0.005 <= seconds(wait) <= 0.2 + SLACK
    assert (
        by_name(
            telemetry, "test_helper_with_aiohttp_honours_retry_after.complete"
        ).status.status_code
        is StatusCode.UNSET
    )
    (retried,) = telemetry.metric_points("llm_latency.retries")
    assert retried.value == 2
    assert dict(retried.attributes) == {
        "server.address": "127.0.0.1",
        "http.response.status_code": 429,
    }


async def test_helper_with_httpx2_draws_jittered_waits(
    telemetry: Telemetry, server: LLMServer
) -> None:
    url = scenario(server, fail=2, fail_with="503")

    @retry(attempts=3, base_delay=0.05, max_delay=0.08)
    async def complete(client: httpx2.AsyncClient) -> int:
        response = await client.get(url)
        response.raise_for_status()
        return response.status_code

    async with httpx2.AsyncClient() as client:
        assert await complete(client) == 200
    # The server named no wait: the backoff spans carry only their reason.
    unavailable = {"error.type": "503", "http.response.status_code": 503}
    assert span_tree(telemetry.spans()) == [
        {
            "name": "test_helper_with_httpx2_draws_jittered_waits.complete",
            "kind": "INTERNAL",
            "attributes": {"llm_latency.attempts": 3, "llm_latency.request_id": "req_test_123"},
            "children": [
                {
                    "name": "GET /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        **request_to("GET", url),
                        **unavailable,
                        **LAG,
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
                        **LAG,
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
                        **LAG,
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
    for wait in assert_one_after_another(
        telemetry, "test_helper_with_httpx2_draws_jittered_waits.complete"
    ):
        assert seconds(wait) <= 0.08 + SLACK


async def test_helper_with_requests_retries_a_reset_connection(
    telemetry: Telemetry, server: LLMServer
) -> None:
    url = scenario(server, fail=1, fail_with="reset")

    @retry(attempts=3, base_delay=0.01)
    def complete() -> int:
        return requests.get(url, timeout=5).status_code

    assert await asyncio.to_thread(complete) == 200
    # The first attempt failed waiting for the answer (the server closed the connection), so
    # the second had to open a new one.
    assert span_tree(telemetry.spans()) == [
        {
            "name": "test_helper_with_requests_retries_a_reset_connection.complete",
            "kind": "INTERNAL",
            "attributes": {"llm_latency.attempts": 2, "llm_latency.request_id": "req_test_123"},
            "children": [
                {
                    "name": "GET /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        **request_to("GET", url),
                        "error.type": "RemoteDisconnected",
                        "llm_latency.connection.reused": False,
                        "llm_latency.failed_phase": "wait",
                    },
                    "children": [
                        *phase_nodes("connect", "send"),
                        {
                            "name": "http.wait",
                            "kind": "INTERNAL",
                            "attributes": {
                                "error.type": "RemoteDisconnected",
                                "llm_latency.phase": "wait",
                                "server.address": "127.0.0.1",
                            },
                        },
                    ],
                },
                {
                    "name": "retry.backoff",
                    "kind": "INTERNAL",
                    "attributes": {"llm_latency.backoff.reason": "ConnectionError"},
                },
                {
                    "name": "GET /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        **request_to("GET", url),
                        **SERVED,
                        "http.request.resend_count": 1,
                        "http.response.status_code": 200,
                        "llm_latency.connection.reused": False,
                        "network.protocol.version": "1.1",
                    },
                    "children": NEW_CONNECTION,
                },
            ],
        }
    ]
    assert_one_after_another(
        telemetry, "test_helper_with_requests_retries_a_reset_connection.complete"
    )
    failed = min(telemetry.requests(), key=lambda s: s.start_time or 0)
    assert failed.status.status_code is StatusCode.ERROR


async def test_non_retryable_error_raised_at_once(telemetry: Telemetry, server: LLMServer) -> None:
    calls = 0

    @retry(attempts=5, base_delay=0.01)
    async def complete(session: aiohttp.ClientSession) -> None:
        nonlocal calls
        calls += 1
        async with session.get(server.url(status=400), raise_for_status=True):
            pass

    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientResponseError) as raised:
            await complete(session)
    assert raised.value.status == 400
    assert calls == 1
    # One attempt and no wait: a 400 is not worth another try.
    assert span_tree(telemetry.spans()) == [
        {
            "name": "test_non_retryable_error_raised_at_once.complete",
            "kind": "INTERNAL",
            "attributes": {
                "error.type": "ClientResponseError",
                "llm_latency.attempts": 1,
                "llm_latency.request_id": "req_test_123",
            },
            "children": [
                {
                    "name": "GET /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        **request_to("GET", server.url(status=400)),
                        **SERVED,
                        **LAG,
                        "error.type": "400",
                        "http.response.status_code": 400,
                        "llm_latency.connection.reused": False,
                        "network.protocol.version": "1.1",
                    },
                    "children": NEW_CONNECTION,
                }
            ],
        }
    ]
    assert (
        by_name(telemetry, "test_non_retryable_error_raised_at_once.complete").status.status_code
        is StatusCode.ERROR
    )


async def test_last_exception_reraised_unchanged(telemetry: Telemetry) -> None:
    raised: list[BaseException] = []

    @retry(attempts=3, base_delay=0.0)
    def flaky() -> None:
        error = ConnectionResetError(f"reset {len(raised)}")
        raised.append(error)
        raise error

    with pytest.raises(ConnectionResetError) as caught:
        flaky()
    assert len(raised) == 3
    assert caught.value is raised[-1]
    # No HTTP attempt was made (the function raised before any), so none is counted; the two
    # waits between its three calls are.
    wait = {
        "name": "retry.backoff",
        "kind": "INTERNAL",
        "attributes": {"llm_latency.backoff.reason": "ConnectionResetError"},
    }
    assert span_tree(telemetry.spans()) == [
        {
            "name": "test_last_exception_reraised_unchanged.flaky",
            "kind": "INTERNAL",
            "attributes": {"error.type": "ConnectionResetError", "llm_latency.attempts": 0},
            "children": [wait, wait],
        }
    ]


async def test_deadline_gives_up_instead_of_waiting(
    telemetry: Telemetry, server: LLMServer
) -> None:
    url = scenario(server, fail=5, retry_ms=5000)

    @retry(attempts=5, base_delay=0.01, deadline=1.0)
    async def complete(client: httpx2.AsyncClient) -> None:
        (await client.get(url)).raise_for_status()

    started = time.monotonic()
    async with httpx2.AsyncClient() as client:
        with pytest.raises(httpx2.HTTPStatusError):
            await complete(client)
    # It did not sleep the 5 s the server asked for (bounded by that wait, not by the machine's
    # speed: one request took 1.5 s on a loaded machine).
    assert time.monotonic() - started < 5.0
    # One attempt, and no wait: the one asked for would have passed the deadline.
    assert span_tree(telemetry.spans()) == [
        {
            "name": "test_deadline_gives_up_instead_of_waiting.complete",
            "kind": "INTERNAL",
            "attributes": {"error.type": "HTTPStatusError", "llm_latency.attempts": 1},
            "children": [
                {
                    "name": "GET /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        **request_to("GET", url),
                        **LAG,
                        "error.type": "429",
                        "http.response.header.retry-after-ms": ["5000"],
                        "http.response.status_code": 429,
                        "llm_latency.connection.reused": False,
                        "network.protocol.version": "1.1",
                    },
                    "children": NEW_CONNECTION,
                }
            ],
        }
    ]


async def test_cancellation_during_a_wait(telemetry: Telemetry, server: LLMServer) -> None:
    url = scenario(server, fail=5, retry_ms=2000)

    @retry(attempts=5)
    async def complete(session: aiohttp.ClientSession) -> None:
        async with session.get(url, raise_for_status=True):
            pass

    async with aiohttp.ClientSession() as session:
        task = asyncio.ensure_future(complete(session))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    # The wait the server asked for was under way when the call was cancelled.
    assert span_tree(telemetry.spans()) == [
        {
            "name": "test_cancellation_during_a_wait.complete",
            "kind": "INTERNAL",
            "attributes": {"error.type": "CancelledError", "llm_latency.attempts": 1},
            "children": [
                {
                    "name": "GET /v1/chat/completions",
                    "kind": "CLIENT",
                    "attributes": {
                        **request_to("GET", url),
                        **LAG,
                        "error.type": "429",
                        "http.response.header.retry-after-ms": ["2000"],
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
                        "llm_latency.backoff.retry_after": 2.0,
                    },
                },
            ],
        }
    ]
    wait = by_name(telemetry, "retry.backoff")
    assert wait.status.status_code is StatusCode.ERROR
    assert seconds(wait) < 1.0  # ended at the cancellation, not after the 2 s
    parent = by_name(telemetry, "test_cancellation_during_a_wait.complete")
    assert parent.status.status_code is StatusCode.ERROR
    telemetry.assert_all_ended_once()


def test_invalid_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="attempts"):
        retry(attempts=0)
    with pytest.raises(ValueError, match="negative"):
        retry(base_delay=-1)
    with pytest.raises(ValueError, match="deadline"):
        retry(deadline=-1)
    with pytest.raises(ValueError, match="name"):
        retry(name=" ")


def test_the_call_span_is_named_as_a_trace_list_can_show_it(telemetry: Telemetry) -> None:
    """After the function's qualified name without ``<locals>`` (which a trace list showed as
    ``Demo.rate_limited.<locals>.complete``), or after ``name=``."""

    class Client:
        @retry(attempts=1)
        def complete(self) -> str:
            return "ok"

    @retry(attempts=1, name="chat with fallback")
    def named() -> str:
        return "ok"

    assert Client().complete() == named() == "ok"
    assert [span.name for span in telemetry.spans()] == [
        "test_the_call_span_is_named_as_a_trace_list_can_show_it.Client.complete",
        "chat with fallback",
    ]


def test_helper_works_uninstrumented() -> None:
    llm_latency.uninstrument()
    calls = 0

    @retry(attempts=3, base_delay=0.0)
    def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise TimeoutError("slow")
        return "ok"

    assert flaky() == "ok"
    assert calls == 3


# -- the schedule and its inputs --------------------------------------------------------------


@given(
    st.integers(0, 200),
    st.floats(0, 60, allow_nan=False),
    st.floats(0, 600, allow_nan=False),
)
def test_backoff_schedule(retry_number: int, base: float, cap: float) -> None:
    delay = backoff_delay(retry_number, base, cap)
    assert 0.0 <= delay <= min(cap, base * 2.0 ** min(retry_number, 64))
    assert delay <= cap


def test_backoff_is_jittered() -> None:
    delays = {round(backoff_delay(3, 1.0, 30.0), 6) for _ in range(50)}
    assert len(delays) > 40
    assert all(0 <= d <= 8.0 for d in delays)


def test_retry_after_parsing() -> None:
    assert hdr.retry_after("1500", None) == 1.5
    assert hdr.retry_after(None, "2") == 2.0
    assert hdr.retry_after("bad", "3") == 3.0
    assert hdr.retry_after(None, None) is None
    assert hdr.retry_after(None, "garbage") is None
    soon = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= (hdr.retry_after(None, soon) or 0) <= 30
    past = email.utils.formatdate(time.time() - 30, usegmt=True)
    assert hdr.retry_after(None, past) == 0.0


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (ValueError(), False),
        (KeyError(), False),
        (httpx2.ConnectError("x"), True),
        (httpx2.ReadTimeout("x"), True),
        (requests.ConnectionError(), True),
    ],
)
def test_transient_errors(error: BaseException, expected: bool) -> None:
    assert is_transient(error) is expected


@pytest.mark.parametrize(("status", "expected"), [
    (408, True), (409, True), (429, True), (500, True), (503, True), (599, True),
    (400, False), (401, False), (404, False), (422, False),
])  # fmt: skip
def test_transient_statuses(status: int, expected: bool) -> None:
    request = httpx2.Request("GET", "http://127.0.0.1/")
    response = httpx2.Response(status, request=request)
    error = httpx2.HTTPStatusError("status", request=request, response=response)
    assert is_transient(error) is expected
