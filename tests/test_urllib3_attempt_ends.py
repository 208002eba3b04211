"""Each way a urllib3 attempt can end, one test per row of the table in
``llm_latency.adapters._urllib3_attempt`` (the test is named after the row): the attempt ends
exactly once, at the moment the row says, with or without the error it says.

"At once" is checked by the attempts in flight (``emitter.active.in_flight()``) right after
the call that ends it, while the program still holds the response."""

from __future__ import annotations

import asyncio
import gc
import re
from collections.abc import Callable
from typing import Any

import pytest
import urllib3
from opentelemetry import propagate
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.trace import ReadableSpan

from llm_latency import emitter as emitting
from llm_latency.adapters import _urllib3_attempt
from llm_latency.timeline import Timeline
from tests.attributes import attributes, str_attr
from tests.bad_servers import RawServer
from tests.conftest import Telemetry
from tests.servers import LLMServer, unused_port


def in_flight() -> int:
    emitter = emitting.active
    assert emitter is not None
    return len(emitter.in_flight())


async def in_thread(work: Callable[[], Any]) -> Any:
    return await asyncio.to_thread(work)


def failure(request: ReadableSpan) -> tuple[object, object]:
    """``(llm_latency.failed_phase, error.type)`` of an attempt; ``(None, None)`` for none."""
    found = attributes(request)
    return found.get("llm_latency.failed_phase"), found.get("error.type")


def one_after_another(telemetry: Telemetry) -> tuple[ReadableSpan, ReadableSpan]:
    """The two attempts, the first ended before the second started."""
    first, second = sorted(telemetry.requests(), key=lambda s: s.start_time or 0)
    assert first.end_time is not None and second.start_time is not None
    assert first.end_time <= second.start_time
    return first, second


def test_the_table_lists_the_ways_tested_here() -> None:
    doc = _urllib3_attempt.__doc__ or ""
    listed = set(re.findall(r"^\| ``(\w+)``", doc, re.MULTILINE))
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    assert listed == tested - {"the_table_lists_the_ways_tested_here"}


class _BrokenPropagator(TextMapPropagator):
    """A program's propagator that fails: the plugin's start fails after the span started."""

    def extract(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("propagator bug")

    def inject(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("propagator bug")

    @property
    def fields(self) -> set[str]:
        return set()


async def test_start_fault(
    telemetry: Telemetry, server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(propagate, "_HTTP_TEXT_FORMAT", _BrokenPropagator())

    def work() -> None:
        with urllib3.PoolManager() as pool:
            response = pool.request("GET", server.url())
            assert response.status == 200
            assert in_flight() == 0

    await in_thread(work)
    (request,) = telemetry.requests()
    assert telemetry.phases(request) == {}  # ended at the start: the request went on untraced
    assert "http.response.status_code" not in attributes(request)
    telemetry.assert_all_ended_once()


def test_request_error(telemetry: Telemetry) -> None:
    # urllib3 retries the refused connect once: the first attempt ends when _make_request
    # raises, before the retry starts, not when urlopen gives up after it.
    url = f"http://127.0.0.1:{unused_port()}/v1/chat/completions"
    with urllib3.PoolManager() as pool, pytest.raises(urllib3.exceptions.MaxRetryError):
        pool.request("GET", url, retries=urllib3.Retry(connect=1, backoff_factor=0))
    first, second = one_after_another(telemetry)
    assert failure(first) == failure(second) == ("connect", "NewConnectionError")
    telemetry.assert_all_ended_once()


async def test_urlopen_error(telemetry: Telemetry, server: LLMServer) -> None:
    # urlopen raises before _make_request: no free connection in a blocking pool of one.
    def work() -> None:
        with urllib3.HTTPConnectionPool("127.0.0.1", server.port, maxsize=1, block=True) as pool:
            held = pool.urlopen("GET", server.url(chunks=3, gap=0.2), preload_content=False)
            with pytest.raises(urllib3.exceptions.EmptyPoolError):
                pool.urlopen("GET", server.url(), pool_timeout=0)
            assert in_flight() == 1  # the held one
            held.read()

    await in_thread(work)
    queued = [r for r in telemetry.requests() if failure(r) != (None, None)]
    (request,) = queued
    assert failure(request) == ("queue", "EmptyPoolError")
    telemetry.assert_all_ended_once()


async def test_not_handed(
    telemetry: Telemetry, server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fault in the plugin's response hook, before the response holds its attempt, keeps the
    # two apart: the attempt ends when urlopen returns; the program gets its response as is.
    def broken(self: Timeline) -> int:
        raise RuntimeError("plugin bug")

    def work() -> bytes:
        with urllib3.PoolManager() as pool:
            response = pool.request("GET", server.url(chunks=3), preload_content=False)
            assert in_flight() == 0
            return response.read()

    monkeypatch.setattr(Timeline, "current_phase", property(broken))
    assert await in_thread(work) == b"chunk0\nchunk1\nchunk2\n"
    (request,) = telemetry.requests()
    assert "receive" not in telemetry.phases(request)
    telemetry.assert_all_ended_once()


async def test_preloaded(telemetry: Telemetry, server: LLMServer) -> None:
    # urllib3's default reads the whole body as the response is built; a HEAD response has
    # none. Either is over when urlopen returns, with the facts of its headers.
    def work() -> None:
        with urllib3.PoolManager() as pool:
            assert pool.request("GET", server.url()).status == 200
            assert in_flight() == 0
            response = pool.request("HEAD", server.url(), preload_content=False)
            assert in_flight() == 0
            assert response.status == 200

    await in_thread(work)
    for request in telemetry.requests():
        assert failure(request) == (None, None)
        assert attributes(request)["http.response.status_code"] == 200
        assert attributes(request)["http.response.header.x-request-id"] == ("req_test_123",)
        assert set(telemetry.phases(request)) >= {"send", "wait", "receive"}
    assert len(telemetry.requests()) == 2


async def test_body_read(telemetry: Telemetry, server: LLMServer) -> None:
    def work() -> None:
        with urllib3.PoolManager() as pool:
            response = pool.request("GET", server.url(chunks=3, gap=0.02), preload_content=False)
            assert in_flight() == 1
            assert response.read() == b"chunk0\nchunk1\nchunk2\n"
            assert in_flight() == 0  # read to its end: not closed, still held

    await in_thread(work)
    request = telemetry.request()
    assert failure(request) == (None, None)
    assert set(telemetry.phases(request)) >= {"send", "wait", "receive"}


def assert_read_fails(telemetry: Telemetry, response: bytes) -> None:
    """Reading the body of ``response`` (sent as it is, then FIN) raises: the attempt failed
    in its receive phase, with urllib3's error."""
    with RawServer(response) as server, urllib3.PoolManager() as pool:
        held = pool.request("GET", server.url(), preload_content=False)
        with pytest.raises(urllib3.exceptions.ProtocolError):
            held.read()
    assert failure(telemetry.request()) == ("receive", "ProtocolError")
    telemetry.assert_all_ended_once()


def test_read_error(telemetry: Telemetry) -> None:
    assert_read_fails(telemetry, b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc")


async def test_closed(telemetry: Telemetry, server: LLMServer) -> None:
    def work() -> None:
        with urllib3.PoolManager() as pool:
            response = pool.request(
                "GET", server.url(chunks=20, gap=0.05, sse=1), preload_content=False
            )
            chunks = response.stream(64)
            next(chunks)  # the chunked read is suspended in its generator, kept below
            response.close()
            assert in_flight() == 0
            del chunks

    await in_thread(work)
    request = telemetry.request()
    assert failure(request) == (None, None)
    assert "receive" in telemetry.phases(request)


def test_framing_error(telemetry: Telemetry) -> None:
    # urllib3 closes the response on a bad chunk-size line, then raises: the error counts.
    assert_read_fails(telemetry, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")


async def test_drained(telemetry: Telemetry, server: LLMServer) -> None:
    # Following a redirect, urllib3 drains the 302: that attempt ends before the next starts.
    def work() -> None:
        with urllib3.PoolManager() as pool:
            assert pool.request("GET", server.url("/redirect")).status == 200

    await in_thread(work)
    first, second = one_after_another(telemetry)
    assert attributes(first)["http.response.status_code"] == 302
    assert str_attr(second, "url.full").endswith("/v1/chat/completions")
    telemetry.assert_all_ended_once()


async def test_collected(telemetry: Telemetry, server: LLMServer) -> None:
    def work() -> None:
        with urllib3.PoolManager() as pool:
            response = pool.request(
                "GET", server.url(chunks=5, gap=0.05, sse=1), preload_content=False
            )
            response.read(16)
            assert in_flight() == 1
            del response
            gc.collect()
            assert in_flight() == 0

    await in_thread(work)
    assert failure(telemetry.request()) == (None, None)
    telemetry.assert_all_ended_once()
