"""How ``probe`` sends its requests with each client: ``-n`` of them, ``-c`` at once, each
numbered, on pooled or fresh connections, trusting ``--cacert``, resolving through ``--dns``.

``--timeout`` is one deadline per request for every client: from the moment the request is
issued (waiting for a pooled connection included) to its last byte, streamed or not. aiohttp
enforces it with its total timeout; httpx2 by cancelling the request at the deadline (its own
timeouts are per operation, so each also gets the whole deadline); requests by urllib3's total
timeout for connecting and the headers, then, for the body, by a socket timeout that shrinks to
what is left of the deadline before each read.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from llm_latency.cli.errors import CLIError
from llm_latency.cli.probe_input import ProbeRequest
from llm_latency.cli.results import REQUEST_NUMBER

#: ``--client``'s choices.
CLIENT_NAMES = ("aiohttp", "httpx2", "requests")
#: The shortest socket timeout set once the deadline is near or past: 0 would make the
#: socket non-blocking instead of timing out.
_MIN_READ_TIMEOUT = 0.001


@dataclass
class ProbeOptions:
    """How to send: how many, how many at once, on what connections, trusting what."""

    n: int = 1
    concurrency: int = 1
    fresh: bool = False
    timeout: float = 60.0
    ca_file: str | None = None
    dns: str | None = None


def _ssl_context(ca_file: str | None) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise CLIError(f"cannot read the CA file {ca_file}: {exc}") from None


async def _run_many(
    n: int, concurrency: int, one: Callable[[], Awaitable[None]], errors: list[BaseException]
) -> None:
    """``one()`` ``n`` times, ``concurrency`` at once, each under its ``REQUEST_NUMBER``."""
    gate = asyncio.Semaphore(max(1, concurrency))

    async def guarded(number: int) -> None:
        async with gate:
            REQUEST_NUMBER.set(number)  # this task's own context
            try:
                await one()
            except Exception as exc:
                errors.append(exc)

    await asyncio.gather(*(guarded(number) for number in range(1, n + 1)))


async def _probe_aiohttp(
    url: str, request: ProbeRequest, options: ProbeOptions, errors: list[BaseException]
) -> None:
    import aiohttp

    resolver = aiohttp.AsyncResolver(nameservers=[options.dns]) if options.dns else None
    ssl: Any = _ssl_context(options.ca_file) if options.ca_file else True

    def session() -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            ssl=ssl,
            resolver=resolver,
            use_dns_cache=not options.fresh,
            limit=max(options.concurrency, 1),
        )
        # trust_env: HTTPS_PROXY and NO_PROXY, as httpx and requests read them by default.
        return aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=options.timeout),
            trust_env=True,
        )

    # --fresh: a session per request, as a program that makes a client per call does (as
    # the other clients' probes do), so that the diagnosis speaks of that program
    shared = None if options.fresh else session()

    async def one() -> None:
        own = session() if shared is None else None
        active = own if own is not None else shared
        assert active is not None
        try:
            async with active.request(
                request.method, url, headers=request.headers, data=request.body
            ) as response:
                async for _ in response.content.iter_any():
                    pass
        finally:
            if own is not None:
                await own.close()

    try:
        await _run_many(options.n, options.concurrency, one, errors)
    finally:
        if shared is not None:
            await shared.close()
        if resolver is not None:
            await resolver.close()


async def _probe_httpx2(
    url: str, request: ProbeRequest, options: ProbeOptions, errors: list[BaseException]
) -> None:
    import httpx2

    verify: Any = _ssl_context(options.ca_file) if options.ca_file else True
    limits = httpx2.Limits(max_connections=options.concurrency)

    def client() -> Any:
        return httpx2.AsyncClient(verify=verify, timeout=options.timeout, limits=limits)

    shared = None if options.fresh else client()

    async def send(active: Any) -> None:
        async with active.stream(
            request.method, url, headers=request.headers, content=request.body
        ) as response:
            async for _ in response.aiter_raw():
                pass

    async def one() -> None:
        own = client() if shared is None else None
        try:
            await asyncio.wait_for(send(own or shared), options.timeout)  # the deadline
        finally:
            if own is not None:
                await own.aclose()

    try:
        await _run_many(options.n, options.concurrency, one, errors)
    finally:
        if shared is not None:
            await shared.aclose()


class _Workers:
    """``count`` daemon threads that run blocking calls for the event loop. A request still in
    flight when the probe is stopped does not hold the process up, as it would on a
    ThreadPoolExecutor's threads (joined at exit)."""

    def __init__(self, count: int) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"llm-latency-probe-{i}", daemon=True)
            for i in range(max(1, count))
        ]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    def run(self, call: Callable[[], None]) -> asyncio.Future[None]:
        """Run ``call`` on a worker, in a copy of the caller's context (as
        ``asyncio.to_thread``); the future is its outcome."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        context = contextvars.copy_context()

        def settle(error: BaseException | None) -> None:
            if future.done():  # cancelled: the probe was stopped
                return
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

        def job() -> None:
            error: BaseException | None = None
            try:
                context.run(call)
            except BaseException as exc:
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: the probe stopped
                loop.call_soon_threadsafe(settle, error)

        self._jobs.put(job)
        return future

    def stop(self, wait: bool) -> None:
        """Let the threads end after their current call; ``wait`` for them."""
        for _ in self._threads:
            self._jobs.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


def _shrink_read_timeout(response: Any, deadline: float) -> None:
    """The next read of ``response``'s body may wait only what is left until ``deadline``."""
    connection = getattr(response.raw, "connection", None)
    sock = getattr(connection, "sock", None)
    if sock is not None:
        sock.settimeout(max(deadline - time.monotonic(), _MIN_READ_TIMEOUT))


async def _probe_requests(
    url: str, request: ProbeRequest, options: ProbeOptions, errors: list[BaseException]
) -> None:
    """requests is synchronous: each request runs on one of ``concurrency`` worker threads,
    each thread with its own Session (a Session is not shared across threads). So sequential
    requests (``-c 1``) all run on one thread and reuse one connection, and ``-c N`` opens at
    most N."""
    import requests
    import urllib3

    verify: Any = options.ca_file if options.ca_file else True
    local = threading.local()
    sessions: list[Any] = []
    sessions_lock = threading.Lock()

    def session() -> Any:
        if options.fresh:
            return requests.Session()
        if not hasattr(local, "session"):
            local.session = requests.Session()
            with sessions_lock:
                sessions.append(local.session)
        return local.session

    def one_sync() -> None:
        deadline = time.monotonic() + options.timeout
        active = session()
        try:
            with active.request(
                request.method,
                url,
                headers=dict(request.headers),
                data=request.body,
                timeout=urllib3.Timeout(total=options.timeout),
                verify=verify,
                stream=True,
            ) as response:
                _shrink_read_timeout(response, deadline)
                for _ in response.iter_content(None):
                    _shrink_read_timeout(response, deadline)
        finally:
            if options.fresh:
                active.close()

    workers = _Workers(options.concurrency)
    finished = False
    try:
        await _run_many(options.n, options.concurrency, lambda: workers.run(one_sync), errors)
        finished = True
    finally:
        workers.stop(wait=finished)
        if finished:
            for each in sessions:
                each.close()


#: Each client's way to send a URL's requests, by its ``--client`` name.
CLIENTS = {"aiohttp": _probe_aiohttp, "httpx2": _probe_httpx2, "requests": _probe_requests}
