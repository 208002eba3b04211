"""Every attempt ends exactly once, however its body is abandoned (read to the end, closed,
released or garbage-collected), and no phase is invented."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable
from typing import Any

import httpx
import httpx2
import requests
import urllib3

from llm_latency import emitter as emitting
from tests.attributes import attributes
from tests.conftest import Telemetry
from tests.servers import LLMServer, unused_port

ROUNDS = 30


async def in_thread(work: Callable[[], Any]) -> Any:
    return await asyncio.to_thread(work)


def open_attempts() -> int:
    emitter = emitting.active
    assert emitter is not None
    return len(emitter.in_flight())


def assert_every_attempt_ended(telemetry: Telemetry, count: int) -> None:
    assert open_attempts() == 0
    assert len(telemetry.requests()) == count
    telemetry.assert_all_ended_once()


async def test_urllib3_stream_closed_while_its_generator_is_kept(
    telemetry: Telemetry, server: LLMServer
) -> None:
    # As botocore's EventStream.close() does after a break out of converse_stream: the raw
    # urllib3 response is closed while its chunked read is suspended in a generator that the
    # program still holds.
    url = server.url(chunks=20, gap=0.05, sse=1)
    kept: list[Any] = []

    def work() -> None:
        with urllib3.PoolManager() as pool:
            for _ in range(ROUNDS):
                response = pool.request("POST", url, body=b"{}", preload_content=False)
                chunks = response.stream(64)
                next(chunks)
                kept.append(chunks)
                response.close()

    await in_thread(work)
    assert_every_attempt_ended(telemetry, ROUNDS)


async def test_requests_iter_lines_kept_and_response_closed(
    telemetry: Telemetry, server: LLMServer
) -> None:
    url = server.url(chunks=20, gap=0.05, sse=1)
    kept: list[Any] = []

    def work() -> None:
        with requests.Session() as session:
            for _ in range(ROUNDS):
                response = session.get(url, stream=True)
                lines = response.iter_lines()
                next(lines)
                kept.append(lines)
                response.close()

    await in_thread(work)
    assert_every_attempt_ended(telemetry, ROUNDS)


async def test_requests_response_dropped_unread_ends_when_collected(
    telemetry: Telemetry, server: LLMServer
) -> None:
    url = server.url(chunks=5, gap=0.05, sse=1)

    def work() -> None:
        for _ in range(3):
            response = requests.get(url, stream=True)
            next(response.iter_content(16))
            del response
            gc.collect()

    await in_thread(work)
    assert_every_attempt_ended(telemetry, 3)


async def test_requests_response_abandoned_in_a_reference_cycle_ends_when_collected(
    telemetry: Telemetry, server: LLMServer
) -> None:
    # As Locust's HttpSession does: the response and its request_meta hold each other, and the
    # task fails before reading or closing the stream. Only the cycle collector frees them, in
    # any order: the http.client response inside is closed first, so the urllib3 response
    # reads as closed and IOBase's finalizer never calls its close().
    url = server.url(chunks=5, gap=0.05, sse=1)

    def task(session: requests.Session) -> None:
        response = session.post(url, json={"stream": True}, stream=True)
        response.request_meta = {"response": response}  # type: ignore[attr-defined]
        raise ValueError("the task fails before reading the stream")

    def work() -> None:
        gc.disable()  # no collection before the one below: the responses stay open until then
        try:
            with requests.Session() as session:
                for _ in range(3):
                    with contextlib.suppress(ValueError):
                        task(session)
                assert open_attempts() == 3
                gc.collect()
        finally:
            gc.enable()

    await in_thread(work)
    assert_every_attempt_ended(telemetry, 3)
    for request in telemetry.requests():
        assert set(telemetry.phases(request)) >= {"send", "wait", "receive"}


async def test_httpx_response_dropped_unread_ends_when_collected(
    telemetry: Telemetry, server: LLMServer
) -> None:
    url = server.url(chunks=5, gap=0.05, sse=1)

    def work() -> None:
        for module in (httpx, httpx2):
            with module.Client() as client:
                for _ in range(3):
                    response = client.send(client.build_request("GET", url), stream=True)
                    next(response.iter_bytes())
                    del response
                    gc.collect()

    await in_thread(work)
    assert_every_attempt_ended(telemetry, 6)


async def test_refused_plain_http_connect_has_no_send_phase(telemetry: Telemetry) -> None:
    # Plain HTTP connects inside send: the send had not started when the connect failed.
    url = f"http://127.0.0.1:{unused_port()}/v1/chat/completions"

    def work() -> None:
        try:
            requests.post(url, json={"model": "m"}, timeout=5)
        except requests.exceptions.ConnectionError:
            return
        raise AssertionError("the connect was not refused")

    await in_thread(work)
    (request,) = telemetry.requests()
    assert set(telemetry.phases(request)) == {"connect"}
    assert attributes(request)["llm_latency.failed_phase"] == "connect"
