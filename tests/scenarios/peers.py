"""The loopback peers of the scenarios, each on an event loop of its own in a thread (so a
program that blocks its own loop does not also hold the server back): the product's mock
server, the tests' shaped LLM server, a server whose stream pauses, and a relay that puts a
distance (a one-way delay) between client and server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

from aiohttp import web

from llm_latency.testing import HandshakeDelay

T = TypeVar("T")


@contextlib.contextmanager
def in_thread(factory: Callable[[], AbstractAsyncContextManager[T]]) -> Iterator[T]:
    """Enter the async context ``factory()`` on a new loop in a thread; yield what it gives,
    and exit it (and stop the loop) when the block ends."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    done: asyncio.Event | None = None
    box: dict[str, Any] = {}

    async def main() -> None:
        nonlocal done
        done = asyncio.Event()
        try:
            async with factory() as value:
                box["value"] = value
                ready.set()
                await done.wait()
        except BaseException as error:
            box["error"] = error
            ready.set()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    ready.wait(30)
    if "error" in box:
        raise box["error"]
    try:
        yield box["value"]
    finally:
        assert done is not None
        loop.call_soon_threadsafe(done.set)
        thread.join(30)
        loop.close()


# -- a stream that pauses ----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def pausing_stream(pause: float, chunks: int = 20) -> AsyncIterator[str]:
    """An SSE server whose stream stops for ``pause`` seconds halfway; yields its URL."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for i in range(chunks):
            await asyncio.sleep(pause if i == chunks // 2 else 0.01)
            await response.write(f"data: {json.dumps({'n': i})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    async with serving(app) as base:
        yield f"{base}/v1/chat/completions"


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """``app`` on a free loopback port; yields its base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


# -- distance ----------------------------------------------------------------------------------


class DistanceRelay(HandshakeDelay):
    """A TCP relay to ``127.0.0.1:target_port`` that delays every byte by ``delay`` seconds
    in each direction (one way): a server far away. Loopback cannot delay the TCP handshake itself, so
    the client's first bytes wait one round trip more, which is what the SYN and SYN-ACK would
    have cost (the slow-connect rule reads TCP and TLS together). The product's
    ``HandshakeDelay`` runs it; only what each connection's relay does differs."""

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target_port)
        await asyncio.gather(
            self._pipe(reader, up_writer, first_extra=2 * self._delay),
            self._pipe(up_reader, writer, first_extra=0.0),
        )

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, first_extra: float
    ) -> None:
        """Copy with each chunk leaving ``delay`` after it arrived, in order."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                await asyncio.sleep(max(due - loop.time(), 0.0))
                writer.write(data)
                await writer.drain()
            writer.close()

        delivering = asyncio.create_task(deliver())
        extra = first_extra
        try:
            while data := await reader.read(65536):
                queue.put_nowait((loop.time() + self._delay + extra, data))
                extra = 0.0
        except OSError:
            pass
        finally:
            queue.put_nowait((0.0, b""))
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await delivering


def stall(seconds: float) -> tuple[int, int]:
    """Block the calling thread (the program's own loop) for ``seconds``; the stall's bounds in
    ns since the epoch."""
    start = time.time_ns()
    time.sleep(seconds)
    return start, time.time_ns()
