"""``llm-latency probe``: httpstat for LLM endpoints.

It sends requests with the chosen client, instrumented by llm-latency itself, and reports each
request's phases from the spans it collected, each request as it finishes: the span collector's
listener turns each finished request span (with its phase children) into a RequestResult and
hands it to ``emit`` on a thread of its own, in finish order. Printing on a thread keeps the
terminal out of the measurement: a slow reader of the output (a pager, a full pipe) blocks that
thread, never the event loop or the client threads that the next requests' phases are timed on.

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
import signal
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from llm_latency.cli.errors import CLIError, describe
from llm_latency.cli.probe_input import ProbeRequest
from llm_latency.cli.results import REQUEST_NUMBER, RequestResult, SpanCollector, result_of
from llm_latency.diagnosis.records import from_readable_spans

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


@dataclass
class UrlRun:
    """One URL's run: the requests in the order they finished, the errors raised, every span
    collected, and why the run stopped early (``interrupted``, ``broken pipe``) if it did."""

    results: list[RequestResult]
    errors: list[BaseException]
    spans: list[ReadableSpan] = field(default_factory=list)
    stopped: str | None = None


Emit = Callable[[RequestResult], None]
_Item = tuple[ReadableSpan, list[ReadableSpan], "int | None"]


class Finished:
    """Collects a run's results as their spans end, and emits each on a printer thread.

    ``origin_ns`` (epoch ns) is the run's start, which ``RequestResult.start`` counts from.
    When ``emit`` raises ``BrokenPipeError`` (the reader of the output went away), nothing more
    is emitted, :attr:`broken` is set and ``on_broken`` is called (from the printer thread).
    """

    def __init__(self, origin_ns: int, emit: Emit | None, on_broken: Callable[[], None]) -> None:
        self.results: list[RequestResult] = []
        self.broken = False
        self._origin = origin_ns
        self._emit = emit
        self._on_broken = on_broken
        self._children: dict[int, list[ReadableSpan]] = {}
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="llm-latency-printer", daemon=True)

    def __enter__(self) -> Finished:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def on_span(self, span: ReadableSpan, number: int | None) -> None:
        """The collector's listener: a span ended (phase spans end before their request's)."""
        context = span.context
        if context is None:
            return
        with self._lock:
            if span.parent is not None:
                self._children.setdefault(span.parent.span_id, []).append(span)
            if span.kind is not SpanKind.CLIENT:
                return
            children = self._children.pop(context.span_id, [])
        self._queue.put((span, children, number))

    def close(self) -> None:
        """Emit what is queued, stop the thread; re-raise what ``emit`` raised (but a broken
        pipe, reported by :attr:`broken`)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if self._failure is not None:
            raise self._failure

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            span, children, number = item
            record, *own = from_readable_spans([span, *children])
            result = result_of(record, own, self._origin)
            if result is None:
                continue
            result.number = number
            self.results.append(result)
            if self._emit is None or self.broken or self._failure is not None:
                continue
            try:
                self._emit(result)
            except BrokenPipeError:
                self.broken = True
                self._on_broken()
            except BaseException as exc:  # re-raised by close(), on the main thread
                self._failure = exc


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
    connector = aiohttp.TCPConnector(
        ssl=_ssl_context(options.ca_file) if options.ca_file else True,
        resolver=resolver,
        force_close=options.fresh,
        use_dns_cache=not options.fresh,
        limit=max(options.concurrency, 1),
    )
    # trust_env: HTTPS_PROXY and NO_PROXY, as httpx and requests read them by default.
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=options.timeout), trust_env=True
    ) as session:

        async def one() -> None:
            async with session.request(
                request.method, url, headers=request.headers, data=request.body
            ) as response:
                async for _ in response.content.iter_any():
                    pass

        try:
            await _run_many(options.n, options.concurrency, one, errors)
        finally:
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


_CLIENTS = {"aiohttp": _probe_aiohttp, "httpx2": _probe_httpx2, "requests": _probe_requests}


class _Stop:
    """Stops a run early: on SIGINT (Ctrl-C; a second one aborts at once), or when the output
    is gone. The spans that end afterwards are dropped: they did not finish."""

    def __init__(self, collector: SpanCollector) -> None:
        self.reason: str | None = None
        self._collector = collector
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()

    def now(self, reason: str) -> None:
        """Stop the run (on the loop's thread)."""
        if self.reason is not None:
            if reason == "interrupted":
                raise KeyboardInterrupt
            return
        self.reason = reason
        self._collector.freeze()
        if self._task is not None:
            self._task.cancel()

    def soon(self, reason: str) -> None:
        """Stop the run, from any thread."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: the run is over
            self._loop.call_soon_threadsafe(self.now, reason)


async def probe_url(
    url: str,
    request: ProbeRequest,
    client: str,
    options: ProbeOptions,
    collector: SpanCollector,
    emit: Emit | None = None,
) -> UrlRun:
    """Send ``options.n`` requests to ``url``; ``emit`` each result as it finishes (on a
    printer thread). SIGINT stops the run: the requests that finished are returned."""
    loop = asyncio.get_running_loop()
    stop = _Stop(collector)
    errors: list[BaseException] = []
    collector.take()
    with Finished(time.time_ns(), emit, lambda: stop.soon("broken pipe")) as finished:
        collector.listener = finished.on_span
        handled = False
        # SIGINT ignored (a run under nohup, in a shell's background) stays ignored; and the
        # loop's removal of its handler puts back Python's default, not the one there before.
        previous = signal.getsignal(signal.SIGINT)
        if previous is not signal.SIG_IGN:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signal.SIGINT, stop.now, "interrupted")
                handled = True
        try:
            await _CLIENTS[client](url, request, options, errors)
            await asyncio.sleep(0)  # let callbacks that end the last spans run
        except asyncio.CancelledError:
            if stop.reason is None:
                raise
        finally:
            if handled:
                loop.remove_signal_handler(signal.SIGINT)
                if previous is not None and signal.getsignal(signal.SIGINT) is not previous:
                    signal.signal(signal.SIGINT, previous)
            collector.listener = None
    return UrlRun(finished.results, errors, collector.take(), stop.reason)


def error_lines(url: str, errors: list[BaseException], timeout: float) -> list[str]:
    """One line per distinct error, most frequent first."""
    counts: dict[str, int] = {}
    for error in errors:
        line = describe(error, url, timeout)
        counts[line] = counts.get(line, 0) + 1
    return [
        f"{line}" + (f" ({count} requests)" if count > 1 else "")
        for line, count in sorted(counts.items(), key=lambda kv: -kv[1])
    ]
