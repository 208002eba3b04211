"""The programs of the applied scenarios (:mod:`tests.scenarios.applied`), each parameterised by
its client's configuration (:class:`Config`): one client for the program's life or one per
call, the pool's limits, the retry policy. What a finding's fix changes is a field of it, named
after the parameter of the client's API that it stands for."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import requests
from opentelemetry.trace import Tracer
from requests.adapters import HTTPAdapter

import llm_latency
from tests.scenarios.programs import BODY


@dataclass(frozen=True)
class Config:
    """A program's client configuration. ``reuse``: one client (``requests.Session``,
    ``httpx.Client``, ``aiohttp.ClientSession``) for the program's life, else one per call;
    ``limit``, ``limit_per_host`` (aiohttp's ``TCPConnector``), ``max_connections``,
    ``max_keepalive_connections`` (``httpx.Limits``), ``pool_maxsize`` (requests'
    ``HTTPAdapter``): the pool; ``retry``: ``"own"`` (a loop of the program's own that sleeps
    ``pause`` after a 429, whatever the server asked) or ``"llm_latency.retry"``, at most
    ``attempts`` attempts; ``use_dns_cache``, ``ttl_dns_cache``: aiohttp's DNS cache."""

    reuse: bool = True
    limit: int = 100
    limit_per_host: int = 0
    max_connections: int = 100
    max_keepalive_connections: int = 20
    pool_maxsize: int = 10
    retry: str = "own"
    attempts: int = 3
    pause: float = 0.25
    use_dns_cache: bool = True
    ttl_dns_cache: int = 10


@dataclass(frozen=True)
class Target:
    """Where a program sends its requests: the URL, the CA to trust (None: plain HTTP), and
    the tracer of its own spans."""

    url: str
    ca_file: str | None
    tracer: Tracer

    def context(self) -> ssl.SSLContext | bool:
        """The client's TLS context (True: the default, for plain HTTP)."""
        if self.ca_file is None:
            return True
        return ssl.create_default_context(cafile=self.ca_file)


# -- a client per call, or one for the program's life ------------------------------------------


def requests_calls(config: Config, target: Target, n: int) -> None:
    """``n`` calls one after another: ``requests.post()`` each (a session per call, inside
    requests), or through one ``requests.Session()``."""
    verify: str | bool = target.ca_file or True
    if config.reuse:
        with requests.Session() as session:
            for _ in range(n):
                session.post(target.url, json=BODY, verify=verify, timeout=30).close()
        return
    for _ in range(n):
        requests.post(target.url, json=BODY, verify=verify, timeout=30).close()


def httpx_calls(config: Config, target: Target, n: int) -> None:
    """``n`` calls one after another: a new ``httpx.Client()`` each, or one reused."""
    verify = target.context()
    if config.reuse:
        with httpx.Client(verify=verify, timeout=30) as client:
            for _ in range(n):
                client.post(target.url, json=BODY)
        return
    for _ in range(n):
        with httpx.Client(verify=verify, timeout=30) as client:
            client.post(target.url, json=BODY)


async def aiohttp_calls(config: Config, target: Target, n: int) -> None:
    """``n`` calls one after another: a new ``aiohttp.ClientSession()`` each, or one reused."""
    context = target.context()

    async def post(session: aiohttp.ClientSession) -> None:
        async with session.post(target.url, json=BODY, ssl=context) as response:
            await response.read()

    if config.reuse:
        async with aiohttp.ClientSession() as session:
            for _ in range(n):
                await post(session)
        return
    for _ in range(n):
        async with aiohttp.ClientSession() as session:
            await post(session)


# -- pools ---------------------------------------------------------------------------------------


async def aiohttp_burst(
    config: Config, target: Target, n: int, resolver: aiohttp.abc.AbstractResolver | None = None
) -> None:
    """``n`` calls at once through one session whose ``TCPConnector`` has the configured
    ``limit``, ``limit_per_host`` and DNS cache, resolving with ``resolver`` (aiohttp's
    default when None)."""
    connector = aiohttp.TCPConnector(
        limit=config.limit,
        limit_per_host=config.limit_per_host,
        use_dns_cache=config.use_dns_cache,
        ttl_dns_cache=config.ttl_dns_cache,
        ssl=target.context(),
        resolver=resolver,
    )
    async with aiohttp.ClientSession(connector=connector) as session:

        async def post() -> None:
            async with session.post(target.url, json=BODY) as response:
                await response.read()

        await asyncio.gather(*(post() for _ in range(n)))


async def httpx_burst(config: Config, target: Target, n: int) -> None:
    """``n`` calls at once through one ``httpx.AsyncClient`` with the configured limits."""
    limits = httpx.Limits(
        max_connections=config.max_connections,
        max_keepalive_connections=config.max_keepalive_connections,
    )
    async with httpx.AsyncClient(limits=limits, verify=target.context(), timeout=30) as client:
        await asyncio.gather(*(client.post(target.url, json=BODY) for _ in range(n)))


def requests_burst(config: Config, target: Target, n: int) -> None:
    """``n`` calls at once from threads through one ``requests.Session`` whose adapter holds
    ``pool_maxsize`` connections and blocks when they are all in use."""
    verify: str | bool = target.ca_file or True
    with requests.Session() as session:
        adapter = HTTPAdapter(pool_maxsize=config.pool_maxsize, pool_block=True)
        session.mount("https://", adapter)
        session.mount("http://", adapter)
        with ThreadPoolExecutor(n) as pool:
            answers = pool.map(
                lambda _: session.post(target.url, json=BODY, verify=verify, timeout=30), range(n)
            )
            for response in answers:
                response.close()


# -- retries -------------------------------------------------------------------------------------


async def aiohttp_retried(config: Config, target: Target, n: int) -> None:
    """``n`` calls one after another, each in a span of the program's own (``ask``), retried
    on a 429 by the program's own loop (a fixed ``pause``) or by ``llm_latency.retry``."""

    async with aiohttp.ClientSession() as session:

        async def post() -> None:
            async with session.post(target.url, json=BODY, raise_for_status=True) as response:
                await response.read()

        send: Callable[[], Awaitable[None]]
        if config.retry == "llm_latency.retry":
            send = llm_latency.retry(attempts=config.attempts)(post)
        else:

            async def send() -> None:
                for attempt in range(config.attempts):
                    try:
                        await post()
                        return
                    except aiohttp.ClientResponseError as error:
                        if error.status != 429 or attempt + 1 == config.attempts:
                            raise
                        await asyncio.sleep(config.pause)

        for _ in range(n):
            with target.tracer.start_as_current_span("ask"):
                await send()


def run_sync(program: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    """A sync program in a thread, so that the loopback peers' loops keep running."""
    return asyncio.to_thread(program, *args)
