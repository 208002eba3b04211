"""A worker that runs each job in an event loop of its own, as sync code calls async code (a
Celery task, a view, a CLI calling ``asyncio.run()`` per job), under a soft limit of 256 open
files. It prints, at its end, one JSON line of what it left alive.

    python tests/programs/loop_jobs.py SHAPE LOOP SETUP URL JOBS

SHAPE:
- ``run``: each job is ``asyncio.run()`` (``uvloop.run()``) of one request with each async
  client: aiohttp, ``httpx.AsyncClient``, ``httpx2.AsyncClient``, and a chat completion with
  ``openai.AsyncOpenAI``;
- ``thread``: the same job, each in a thread of its own (started, then joined);
- ``abandon``: each job starts a streamed request and a non-streamed one with aiohttp on one
  loop, a streamed one with httpx and one with httpx2 on another, runs each loop until the
  streamed ones have their first chunk and the other was sent, then closes it with them in
  flight (never awaited to their end, never cancelled: the tasks are destroyed);
- ``drop``: aiohttp's two requests of ``abandon``, their loop dropped without being closed.

LOOP: ``asyncio`` or ``uvloop``. SETUP: ``plain`` (the same OpenTelemetry set-up, nothing
instrumented) or ``instrumented`` (``llm_latency.instrument()`` with it). URL: the mock server's
chat completions (``llm-latency mock-server``). JOBS: how many.

The line: ``jobs`` done, the first ``error`` (or null), and at the end, after a full
collection: ``files`` open, event ``loops`` alive (and ``closed_loops``), ``objects`` alive
(and their ``growth`` since the warm-up jobs), ``schedstat_files`` (threads' CPU-wait
readers), ``live_state()``, and the ``spans`` exported.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import resource
import ssl
import sys
import threading
from collections.abc import Callable, Coroutine, Sequence
from functools import partial
from typing import Any

import aiohttp
import httpx
import httpx2
import openai
import uvloop
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import llm_latency

#: The soft limit on open files the worker runs under.
FILES = 256
#: Jobs run before the objects alive are counted the first time (imports and first-use caches).
WARMUP = 20
#: One TLS context for every client made (each would load the CA bundle again: 50 ms).
TLS = ssl.create_default_context()
BODY = {"model": "mock-gpt", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


class CountingExporter(SpanExporter):
    """Counts the spans exported and keeps none of them."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


async def job(url: str) -> None:
    """One request with each async client, each client made and closed in the job."""
    async with aiohttp.ClientSession() as session, session.post(url, json=BODY) as response:
        assert response.status == 200, response.status
        await response.read()
    for module in (httpx, httpx2):
        async with module.AsyncClient(verify=TLS) as client:
            assert (await client.post(url, json=BODY)).status_code == 200
    base = url.removesuffix("/chat/completions")
    http_client = openai.DefaultAsyncHttpxClient(verify=TLS)  # the SDK's own, with TLS
    async with openai.AsyncOpenAI(
        base_url=base, api_key="sk-test", max_retries=0, http_client=http_client
    ) as sdk:
        answer = await sdk.chat.completions.create(
            model="mock-gpt", messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
        assert answer.choices


def threaded() -> aiohttp.TCPConnector:
    """A connector that resolves names in threads: aiohttp's aiodns resolver (its default with
    aiodns installed) is shared per loop through a registry that keeps the loop of a session
    never closed, a leak of aiohttp's own, plain or instrumented."""
    return aiohttp.TCPConnector(resolver=aiohttp.ThreadedResolver())


STREAMED = {**BODY, "max_tokens": 6, "stream": True}


async def aiohttp_stream(url: str, arrived: asyncio.Event) -> None:
    session = aiohttp.ClientSession(connector=threaded())
    async with session.post(url, json=STREAMED) as response:
        await response.content.readany()
        arrived.set()
        await response.read()


async def aiohttp_wait(url: str, sent: asyncio.Event) -> None:
    session = aiohttp.ClientSession(connector=threaded())
    sent.set()
    await session.post(url, json={**BODY, "max_tokens": 6})


async def httpx_stream(module: Any, url: str, arrived: asyncio.Event) -> None:
    client = module.AsyncClient(verify=TLS)
    async with client.stream("POST", url, json=STREAMED) as response:
        async for _ in response.aiter_raw():
            arrived.set()


async def in_flight(*starts: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> list[Any]:
    """Start each request, and return once each is in flight (a streamed one has its first
    chunk; a waiting one was sent): the tasks, never awaited."""
    events = [asyncio.Event() for _ in starts]
    tasks = [asyncio.create_task(start(event)) for start, event in zip(starts, events, strict=True)]
    for event in events:
        await event.wait()
    await asyncio.sleep(0.05)  # the waiting one's request is out by now
    assert not any(task.done() for task in tasks)
    return tasks


def new_loop(kind: str) -> asyncio.AbstractEventLoop:
    return uvloop.new_event_loop() if kind == "uvloop" else asyncio.new_event_loop()


def run_job(kind: str, url: str) -> None:
    runner: Callable[[Coroutine[Any, Any, None]], None] = (
        uvloop.run if kind == "uvloop" else asyncio.run
    )
    runner(job(url))


def in_a_thread(kind: str, url: str) -> None:
    failed: list[BaseException] = []

    def work() -> None:
        try:
            run_job(kind, url)
        except BaseException as error:
            failed.append(error)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


def abandon(kind: str, url: str) -> None:
    """Two loops closed with requests in flight: aiohttp's on one, httpx's on the other (httpx's
    anyio keeps a task destroyed inside a cancel scope, and so its loop, plain or not)."""
    for starts in (
        [partial(aiohttp_stream, url), partial(aiohttp_wait, url)],
        [partial(httpx_stream, httpx, url), partial(httpx_stream, httpx2, url)],
    ):
        loop = new_loop(kind)
        loop.run_until_complete(in_flight(*starts))
        loop.close()


def drop(kind: str, url: str) -> None:
    """aiohttp's loop of :func:`abandon`, dropped unclosed (httpx's would stay, with its files,
    with or without llm-latency: anyio keeps it)."""
    loop = new_loop(kind)
    loop.run_until_complete(in_flight(partial(aiohttp_stream, url), partial(aiohttp_wait, url)))


def schedstat_files() -> int:
    """The files open on a thread's scheduler statistics (the CPU-wait readers)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed since
            count += os.readlink(f"/proc/self/fd/{fd}").endswith("/schedstat")
    return count


def measure() -> dict[str, Any]:
    gc.collect()
    loops = [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop)]
    return {
        "files": len(os.listdir("/proc/self/fd")),
        "schedstat_files": schedstat_files(),
        "loops": len(loops),
        "closed_loops": sum(1 for loop in loops if loop.is_closed()),
        "objects": len(gc.get_objects()),
        "live": llm_latency.live_state(),
    }


def main(shape: str, kind: str, setup: str, url: str, jobs: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILES, hard))
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # "Task was destroyed": abandon
    exporter = CountingExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider([InMemoryMetricReader()])
    if setup == "instrumented":
        llm_latency.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    each = {"run": run_job, "thread": in_a_thread, "abandon": abandon, "drop": drop}[shape]
    done, error, warm = 0, None, None
    for number in range(jobs):
        if number == min(WARMUP, jobs // 3):
            warm = measure()
        try:
            each(kind, url)
        except Exception as exc:
            error = f"job {number + 1}: {exc!r}"
            break
        done += 1
    end = measure()
    growth = end["objects"] - warm["objects"] if warm is not None else None
    print(json.dumps({"jobs": done, "error": error, **end, "growth": growth,
                      "spans": exporter.spans}))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
