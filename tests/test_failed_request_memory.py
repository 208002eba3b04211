"""A failed request is freed as the client alone would free it: after refused connections, the
objects that only the cyclic garbage collector reclaims hold nothing of llm-latency's (no
Timeline, attempt, call or span kept alive by the exception's traceback), and are as many as
without the plugin but for the hooks' own frames, emptied.

A client whose exceptions refer to themselves through their tracebacks (urllib3's, requests',
aiohttp's) makes a cycle that holds every frame the exception went through. The hooks take
their frames out of the traceback and clear their locals (arguments, bound methods, state);
what CPython keeps is the empty frame object of a hook that a client frame below it names as
its caller (``f_back``): a Python-level wrapper on the failure path cannot avoid that.
Propagation is off here: with it, the ``traceparent`` header the plugin adds to the request
(a copy of the program's headers, see tests/test_program_objects.py) is in the client's frames
too, a tuple or two per request.
"""

from __future__ import annotations

import asyncio
import gc
import traceback
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import aiohttp
import httpx
import pytest
import requests
import urllib3

import llm_latency
from llm_latency.adapters import _wrappers
from tests.conftest import Telemetry
from tests.servers import unused_port

FAILURES = 5
#: What each client raises for a refused connection.
REFUSED = (
    OSError,
    aiohttp.ClientError,
    httpx.HTTPError,
    requests.RequestException,
    urllib3.exceptions.HTTPError,
)


def refused_url() -> str:
    """A loopback URL nothing listens on."""
    return f"http://127.0.0.1:{unused_port()}/v1/chat/completions"


@contextmanager
def cyclic_garbage() -> Iterator[list[Any]]:
    """The objects that only the cyclic collector frees, made in the block."""
    gc.collect()
    gc.disable()
    found: list[Any] = []
    try:
        gc.set_debug(gc.DEBUG_SAVEALL)
        yield found
        gc.collect()
        found.extend(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def plugin_objects(objects: list[Any]) -> list[str]:
    return [
        type(o).__qualname__
        for o in objects
        if type(o).__module__.startswith(("llm_latency", "opentelemetry"))
    ]


def hook_frames(objects: list[Any]) -> list[FrameType]:
    """The frames of the patching layer's wrappers among ``objects``."""
    return [
        o
        for o in objects
        if isinstance(o, FrameType) and o.f_code.co_filename == _wrappers.__file__
    ]


def failing(client: str, url: str) -> tuple[Callable[[], Awaitable[None]], Callable[[], Any]]:
    """One failed request with ``client`` (awaitable), and how to close what it used."""
    if client == "aiohttp":
        holder: dict[str, aiohttp.ClientSession] = {}

        async def aiohttp_once() -> None:
            session = holder.setdefault("session", aiohttp.ClientSession())
            async with session.post(url, json={}) as response:
                await response.read()

        return aiohttp_once, lambda: holder["session"].close()
    if client == "httpx async":
        async_client = httpx.AsyncClient()

        async def httpx_once() -> None:
            await async_client.post(url, json={})

        return httpx_once, async_client.aclose
    if client == "httpx":
        sync_client = httpx.Client()

        def work() -> Any:
            return sync_client.post(url, json={})

        close: Callable[[], Any] = sync_client.close
    elif client == "requests":
        session = requests.Session()

        def work() -> Any:
            return session.post(url, json={}, timeout=10)

        close = session.close
    else:
        manager = urllib3.PoolManager(retries=False)

        def work() -> Any:
            return manager.request("POST", url, body=b"{}")

        close = manager.clear

    async def sync_once() -> None:
        work()  # on the test's thread: the collector's count is of this thread's objects too

    return sync_once, close


async def garbage_after_failures(client: str) -> list[Any]:
    once, close = failing(client, refused_url())
    with pytest.raises(REFUSED):
        await once()  # warm: imports, pools, the first-request set-up
    with cyclic_garbage() as found:
        for _ in range(FAILURES):
            with pytest.raises(REFUSED):
                await once()
    closed = close()
    if asyncio.iscoroutine(closed):
        await closed
    return found


CLIENTS = ["aiohttp", "httpx", "httpx async", "requests", "urllib3"]


@pytest.mark.parametrize("client", CLIENTS)
async def test_failed_requests_leave_nothing_of_the_plugin_for_the_collector(
    client: str,
) -> None:
    llm_latency.uninstrument()
    plain = len(await garbage_after_failures(client))
    telemetry = Telemetry()
    telemetry.instrument(propagate=False)
    try:
        found = await garbage_after_failures(client)
    finally:
        llm_latency.uninstrument()
    assert len(telemetry.requests()) == FAILURES + 1  # every attempt was traced
    assert plugin_objects(found) == []
    frames = hook_frames(found)
    # Nothing kept through them: no local but the closure's cells (which the hook keeps).
    assert [set(f.f_locals) - set(f.f_code.co_freevars) for f in frames] == [set()] * len(frames)
    assert len(found) - len(frames) <= plain
    if client.startswith("httpx"):
        # httpx's failures make no cycle: neither may the plugin's.
        assert (plain, len(found)) == (0, 0)


def test_a_failed_requests_traceback_reads_as_without_the_plugin() -> None:
    """The hooks' frames are out of the traceback the program prints (and of the chained
    exceptions' ones): the client's own frames, as without the plugin."""

    def frames_of(error: BaseException) -> list[str]:
        names: list[str] = []
        seen: BaseException | None = error
        while seen is not None:
            names += [f.name for f in traceback.extract_tb(seen.__traceback__)]
            seen = seen.__cause__ or seen.__context__
        return names

    def refused() -> BaseException:
        with pytest.raises(REFUSED) as caught:
            requests.post(refused_url(), json={}, timeout=10)
        return caught.value

    llm_latency.uninstrument()
    plain = frames_of(refused())
    telemetry = Telemetry()
    telemetry.instrument()
    try:
        instrumented = frames_of(refused())
    finally:
        llm_latency.uninstrument()
    assert len(telemetry.requests()) == 1
    assert instrumented == plain
