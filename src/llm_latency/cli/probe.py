"""``llm-latency probe``: httpstat for LLM endpoints.

It sends requests with the chosen client, instrumented by llm-latency itself, and reports each
request's phases from the spans it collected.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import ssl
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from llm_latency.cli.errors import CLIError, describe
from llm_latency.cli.redaction import scrub
from llm_latency.cli.results import RequestResult, SpanCollector, summarize, to_results

CLIENT_NAMES = ("aiohttp", "httpx2", "requests")
DEFAULT_MODEL = "gpt-4o-mini"
_LLM_ROUTES = ("/chat/completions", "/completions", "/responses", "/messages")


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
class ProbeRequest:
    """What each probe request sends."""

    method: str
    headers: list[tuple[str, str]]
    body: bytes | None


def parse_url(url: str) -> str:
    """The URL if it is an absolute http(s) URL with a host, else a CLIError (which shows the
    URL without its secrets)."""
    shown = repr(scrub(url, [url]))
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise CLIError(f"malformed URL {shown}: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise CLIError(f"malformed URL {shown}: it must start with http:// or https://")
    if not parts.hostname:
        raise CLIError(f"malformed URL {shown}: no host")
    if port == 0:
        raise CLIError(f"malformed URL {shown}: port 0")
    return url


def parse_header(raw: str) -> tuple[str, str]:
    """``'Name: value'`` as a (name, value) pair, else a CLIError."""
    name, colon, value = raw.partition(":")
    if not colon or not name.strip() or any(c.isspace() for c in name.strip()):
        raise CLIError(f"header {raw!r} is not 'Name: value'")
    return name.strip(), value.strip()


def read_body(data: str | None) -> bytes | None:
    """``-d``: the text itself, or ``@file``'s bytes."""
    if data is None:
        return None
    if data.startswith("@"):
        path = Path(data[1:])
        try:
            return path.read_bytes()
        except OSError as exc:
            raise CLIError(f"cannot read {path}: {exc.strerror or exc}") from None
    return data.encode()


def build_request(
    url: str,
    method: str | None,
    raw_headers: tuple[str, ...],
    data: str | None,
    stream: bool,
    model: str,
) -> ProbeRequest:
    """The request to send: method, headers (with an API key from the environment when none
    is given), and body (a small completion request for a known LLM route when none is given)."""
    headers = [parse_header(h) for h in raw_headers]
    body = read_body(data)
    path = urlsplit(url).path
    is_llm = path.endswith(_LLM_ROUTES)
    if body is None and is_llm and (method is None or method.upper() == "POST"):
        payload: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 16,
        }
        if stream:
            payload["stream"] = True
        body = json.dumps(payload).encode()
    elif body is not None and stream:
        try:
            given = json.loads(body)
        except ValueError:
            given = None
        if isinstance(given, dict) and "stream" not in given:
            given["stream"] = True
            body = json.dumps(given).encode()
    names = {name.lower() for name, _ in headers}
    if body is not None and "content-type" not in names:
        headers.append(("Content-Type", "application/json"))
    if "authorization" not in names and "x-api-key" not in names:
        if path.endswith("/messages") and os.environ.get("ANTHROPIC_API_KEY"):
            headers.append(("x-api-key", os.environ["ANTHROPIC_API_KEY"]))
            if "anthropic-version" not in names:
                headers.append(("anthropic-version", "2023-06-01"))
        elif os.environ.get("OPENAI_API_KEY"):
            headers.append(("Authorization", f"Bearer {os.environ['OPENAI_API_KEY']}"))
    chosen = (method or ("POST" if body is not None else "GET")).upper()
    return ProbeRequest(chosen, headers, body)


def _ssl_context(ca_file: str | None) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise CLIError(f"cannot read the CA file {ca_file}: {exc}") from None


async def _run_many(
    n: int, concurrency: int, one: Callable[[], Awaitable[None]]
) -> list[BaseException]:
    gate = asyncio.Semaphore(max(1, concurrency))
    errors: list[BaseException] = []

    async def guarded() -> None:
        async with gate:
            try:
                await one()
            except Exception as exc:
                errors.append(exc)

    await asyncio.gather(*(guarded() for _ in range(n)))
    return errors


async def _probe_aiohttp(
    url: str, request: ProbeRequest, options: ProbeOptions
) -> list[BaseException]:
    import aiohttp

    n, concurrency, fresh = options.n, options.concurrency, options.fresh
    timeout, ca_file = options.timeout, options.ca_file
    dns = options.dns

    resolver = aiohttp.AsyncResolver(nameservers=[dns]) if dns else None
    connector = aiohttp.TCPConnector(
        ssl=_ssl_context(ca_file) if ca_file else True,
        resolver=resolver,
        force_close=fresh,
        use_dns_cache=not fresh,
        limit=max(concurrency, 1),
    )
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)
    ) as session:

        async def one() -> None:
            async with session.request(
                request.method, url, headers=request.headers, data=request.body
            ) as response:
                async for _ in response.content.iter_any():
                    pass

        try:
            return await _run_many(n, concurrency, one)
        finally:
            if resolver is not None:
                await resolver.close()


async def _probe_httpx2(
    url: str, request: ProbeRequest, options: ProbeOptions
) -> list[BaseException]:
    import httpx2

    n, concurrency, fresh = options.n, options.concurrency, options.fresh
    timeout, ca_file = options.timeout, options.ca_file

    verify: Any = _ssl_context(ca_file) if ca_file else True

    def client() -> Any:
        return httpx2.AsyncClient(
            verify=verify, timeout=timeout, limits=httpx2.Limits(max_connections=concurrency)
        )

    shared = None if fresh else client()

    async def one() -> None:
        own = client() if shared is None else None
        active = own if own is not None else shared
        assert active is not None
        try:
            async with active.stream(
                request.method, url, headers=request.headers, content=request.body
            ) as response:
                async for _ in response.aiter_raw():
                    pass
        finally:
            if own is not None:
                await own.aclose()

    try:
        return await _run_many(n, concurrency, one)
    finally:
        if shared is not None:
            await shared.aclose()


async def _probe_requests(
    url: str, request: ProbeRequest, options: ProbeOptions
) -> list[BaseException]:
    """requests is synchronous: each request runs on a worker thread of a pool of
    ``concurrency`` threads, each thread with its own Session (a Session is not shared across
    threads). So sequential requests (``-c 1``) all run on one thread and reuse one
    connection, and ``-c N`` opens at most N. (``asyncio.to_thread`` would hand consecutive
    requests to different threads of the loop's default pool, each connecting anew.)"""
    import requests

    n, concurrency, fresh = options.n, options.concurrency, options.fresh
    timeout, ca_file = options.timeout, options.ca_file

    verify: Any = ca_file if ca_file else True
    local = threading.local()
    sessions: list[Any] = []
    sessions_lock = threading.Lock()

    def session() -> Any:
        if fresh:
            return requests.Session()
        if not hasattr(local, "session"):
            local.session = requests.Session()
            with sessions_lock:
                sessions.append(local.session)
        return local.session

    def one_sync() -> None:
        active = session()
        try:
            with active.request(
                request.method,
                url,
                headers=dict(request.headers),
                data=request.body,
                timeout=timeout,
                verify=verify,
                stream=True,
            ) as response:
                for _ in response.iter_content(None):
                    pass
        finally:
            if fresh:
                active.close()

    loop = asyncio.get_running_loop()
    workers = ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="llm-latency-probe")

    def one() -> Awaitable[None]:
        context = contextvars.copy_context()  # as asyncio.to_thread does
        return loop.run_in_executor(workers, context.run, one_sync)

    try:
        return await _run_many(n, concurrency, one)
    finally:
        workers.shutdown(wait=True)
        for each in sessions:
            each.close()


async def probe_url(
    url: str,
    request: ProbeRequest,
    client: str,
    options: ProbeOptions,
    collector: SpanCollector,
) -> tuple[list[RequestResult], list[BaseException]]:
    """Send ``options.n`` requests to ``url``; return their results and the errors raised."""
    collector.take()
    if client == "aiohttp":
        errors = await _probe_aiohttp(url, request, options)
    elif client == "httpx2":
        errors = await _probe_httpx2(url, request, options)
    else:
        errors = await _probe_requests(url, request, options)
    await asyncio.sleep(0)  # let callbacks that end the last spans run
    return to_results(collector.take()), errors


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


def json_report(runs: dict[str, list[RequestResult]]) -> dict[str, Any]:
    """``--json``: ``requests`` (each with status, phases, request_id, time_to_first_chunk,
    total, ...) and ``summary`` (per phase p50/p95/max); ``endpoints`` per URL when several."""
    everything = [r for results in runs.values() for r in results]
    report: dict[str, Any] = {
        "requests": [r.as_json() for r in everything if r.kind == "request"],
        "summary": {
            k: {q: v[q] for q in ("p50", "p95", "max")} for k, v in summarize(everything).items()
        },
    }
    if len(runs) > 1:
        report["endpoints"] = {
            url: {
                k: {q: v[q] for q in ("p50", "p95", "max")} for k, v in summarize(results).items()
            }
            for url, results in runs.items()
        }
    return report
