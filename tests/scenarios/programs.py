"""The client side of the scenarios: programs that send requests with aiohttp, httpx or
requests, the way a program does, and the one that blocks its own event loop."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

import llm_latency
from tests.scenarios.peers import stall

#: The body of a chat completion; ``STREAM`` asks for a streamed answer.
BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
STREAM: dict[str, Any] = {**BODY, "stream": True}
#: A request's body, or one per request (called with the request's number, from 0).
Body = dict[str, Any] | Callable[[int], dict[str, Any]]


def chat(words: int, max_tokens: int, stream: bool = True) -> dict[str, Any]:
    """A chat completion whose prompt is ``words`` words (the mock server's prompt tokens), its
    answer capped at ``max_tokens``; streamed with the usage at the end (``include_usage``)."""
    prompt = " ".join(f"w{i}" for i in range(words))
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
    }
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return body


async def other_tenant(port: int, tokens: int) -> asyncio.Task[None]:
    """Another tenant of the provider, not this program (a plain socket: no instrumentation
    sees it): a streamed answer of ``tokens`` tokens from the mock server on ``port``. Returns
    once its answer has begun (it holds one of the server's slots until the answer ends); the
    task reads the rest."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({**chat(1, tokens), "model": "other"}).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    await reader.readuntil(b"\r\n\r\n")  # the response's headers: its slot is taken

    async def rest() -> None:
        try:
            while await reader.read(65536):
                pass
        finally:
            writer.close()

    return asyncio.create_task(rest())


class Stalls:
    """Where the program blocked its own loop (ns since the epoch), as it happened."""

    def __init__(self) -> None:
        self.windows: list[tuple[int, int]] = []

    def block(self, seconds: float) -> None:
        """Block the running loop (a sync call in a coroutine) for ``seconds``."""
        self.windows.append(stall(seconds))

    def later(self, delay: float, seconds: float) -> None:
        """Block the running loop for ``seconds``, ``delay`` seconds from now."""
        asyncio.get_running_loop().call_later(delay, self.block, seconds)


async def aiohttp_requests(
    url: str,
    n: int,
    *,
    concurrent: bool = True,
    fresh: bool = False,
    body: Body | None = None,
    ssl_context: ssl.SSLContext | bool = True,
    timeout: float | None = None,
    retry: bool = False,
    resolver: AbstractResolver | None = None,
    limit: int = 100,
    during: Callable[[], None] | None = None,
) -> None:
    """``n`` POSTs to ``url`` (all at once, or one after another) on one session, or a new
    session per request (``fresh``); ``body``: the same for each, or a function of the
    request's number; ``retry``: through ``llm_latency.retry``; ``during``: called once the
    requests are under way. Failures are the scenario's, not the program's: they are
    swallowed."""

    def connector() -> aiohttp.TCPConnector:
        return aiohttp.TCPConnector(limit=limit, ssl=ssl_context, resolver=resolver)

    limits = aiohttp.ClientTimeout(total=timeout)

    def sent(number: int) -> dict[str, Any]:
        return body(number) if callable(body) else body or BODY

    async def send(session: aiohttp.ClientSession, number: int) -> None:
        async with session.post(
            url, json=sent(number), raise_for_status=retry, timeout=limits
        ) as response:
            await response.read()

    if retry:
        send = llm_latency.retry(attempts=4, base_delay=0.01, max_delay=0.05)(send)

    async def one(session: aiohttp.ClientSession | None, number: int) -> None:
        try:
            if session is None:
                async with aiohttp.ClientSession(connector=connector()) as own:
                    await send(own, number)
            else:
                await send(session, number)
        except (aiohttp.ClientError, TimeoutError, ssl.SSLError, OSError):
            pass

    async with aiohttp.ClientSession(connector=connector()) as shared:
        chosen = None if fresh else shared
        if concurrent:
            tasks = [asyncio.create_task(one(chosen, number)) for number in range(n)]
            if during is not None:
                during()
            await asyncio.gather(*tasks)
        else:
            for number in range(n):
                await one(chosen, number)


class StallingResolver(AbstractResolver):
    """Resolves every name to 127.0.0.1, and blocks the loop once, ``block`` seconds, while
    the first lookup is open (``where="dns"``) or just after it, as connections open
    (``where="connect"``: the block runs after the requests have gone on to connect)."""

    def __init__(self, stalls: Stalls, where: str, block: float) -> None:
        self._stalls = stalls
        self._where = where
        self._block = block
        self._done = False

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        loop = asyncio.get_running_loop()
        if not self._done and self._where in ("dns", "connect"):
            self._done = True
            if self._where == "dns":
                loop.call_soon(self._stalls.block, self._block)
                await asyncio.sleep(0.005)
            else:  # two turns of the loop on: the requests have resumed and are connecting
                loop.call_soon(loop.call_soon, loop.call_soon, self._stalls.block, self._block)
        return [
            ResolveResult(hostname=host, host="127.0.0.1", port=port, family=socket.AF_INET,
                          proto=0, flags=socket.AI_NUMERICHOST)
        ]  # fmt: skip

    async def close(self) -> None:
        """Nothing to close."""


async def httpx_requests(url: str, n: int, max_connections: int) -> None:
    """``n`` POSTs at once through an ``httpx.AsyncClient`` whose pool holds
    ``max_connections``."""
    import httpx

    limits = httpx.Limits(max_connections=max_connections)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        await asyncio.gather(*(client.post(url, json=BODY) for _ in range(n)))


def requests_requests(url: str, n: int, pool_maxsize: int) -> None:
    """``n`` POSTs at once from threads through one ``requests.Session`` whose adapter holds
    ``pool_maxsize`` connections and blocks when they are all in use."""
    import requests
    from requests.adapters import HTTPAdapter

    with requests.Session() as session:
        session.mount("http://", HTTPAdapter(pool_maxsize=pool_maxsize, pool_block=True))
        with ThreadPoolExecutor(n) as pool:
            for response in pool.map(lambda _: session.post(url, json=BODY, timeout=30), range(n)):
                response.close()
