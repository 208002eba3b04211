"""The instrumented programs of the end-to-end run: ``python -m tests.e2e.workload MODE``.

Each exports through OTLP to the bundle's collector (``--protocol http`` or ``grpc``) under its
own service name, and writes every span it exports to ``--record`` (JSON lines), the ground
truth that Jaeger's answers are compared with.

- ``calls``: a scripted set of calls, one trace each: pooled and fresh connections (the openai
  SDK, aiohttp), a stream, a 429 retried by the openai SDK, a refused connection (httpx), and a
  burst through a pool of two (aiohttp).
- ``alerts``: for ``--seconds``, one scenario per host name (``<scenario>.test``, resolved by a
  DNS server of its own), each the cause of one alert of the bundle's rules; ``healthy.test``
  causes none. ``slow-decode.test`` is the product's mock server (``llm_latency.testing``),
  streaming answers with usage (OpenAI's ``include_usage``) of two models: ``steady-model``
  keeps its pace, ``slowing-model`` decodes five times slower in the second half of the run
  (the token metrics, and LLMTimePerOutputTokenRegressed); the scenario prints when each half
  began and when it ended (:data:`DECODE_LINE`).
- ``steady``: one call every ``--pause`` seconds for ``--seconds``, for the fault tests.
- ``steady --lazy``: the same, with the SDK set up by llm-latency from ``OTEL_*`` (the test's
  environment), as for a program that sets up nothing itself: its one warning, its exit budget.
- ``sampling``: traces for the tail-sampling gateway: healthy ones, failed ones, a slow one,
  and traces of several calls.
- ``burst``: the seed's program for ``--seconds``: 30 requests at once through one aiohttp
  session whose ``TCPConnector(limit_per_host=--limit-per-host)`` holds 5 by default, to a slow
  loopback server, again every ``--pause`` seconds (the findings service's pool finding).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import trustme
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

import llm_latency
from llm_latency.testing import LocalDNS, Profile, running
from tests.servers import llm_server, unused_port


class RecordingExporter(SpanExporter):
    """Writes each span as one JSON line: ids, parent, name, status and attributes."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("a")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            assert span.context is not None
            record = {
                "trace_id": f"{span.context.trace_id:032x}",
                "span_id": f"{span.context.span_id:016x}",
                "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
                "name": span.name,
                "kind": span.kind.name,
                "status": span.status.status_code.name,
                "start": span.start_time,
                "end": span.end_time,
                "attributes": {k: _jsonable(v) for k, v in (span.attributes or {}).items()},
            }
            self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.file.close()


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def set_up(
    protocol: str, endpoint: str, service: str, record: Path | None, interval_ms: int
) -> tuple[TracerProvider, MeterProvider]:
    """The program's own providers: OTLP over ``protocol`` to ``endpoint`` (host:port)."""
    span_exporter: SpanExporter
    metric_exporter: MetricExporter
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        span_exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True)
        metric_exporter = OTLPMetricExporter(endpoint=endpoint, insecure=True)
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HTTPMetricExporter,
        )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HTTPSpanExporter,
        )

        span_exporter = HTTPSpanExporter(endpoint=f"http://{endpoint}/v1/traces")
        metric_exporter = HTTPMetricExporter(endpoint=f"http://{endpoint}/v1/metrics")
    resource = Resource.create({"service.name": service})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter, schedule_delay_millis=500))
    if record is not None:
        tracer_provider.add_span_processor(SimpleSpanProcessor(RecordingExporter(record)))
    reader = PeriodicExportingMetricReader(metric_exporter, export_interval_millis=interval_ms)
    meter_provider = MeterProvider(metric_readers=[reader], resource=resource)
    llm_latency.instrument(
        tracer_provider=tracer_provider, meter_provider=meter_provider, configure=False
    )
    return tracer_provider, meter_provider


# -- calls ----------------------------------------------------------------------------------


async def scripted_calls(marks: Path | None) -> None:
    """The calls; with ``marks``, the stream's times as the program saw them (wall clock, ns),
    written there as JSON: ``called`` (before ``create``), ``headers`` (when ``create``
    returned: the response's headers were in), and per chunk the SDK yielded, ``asked`` (when
    the program asked for it), ``got`` (when it came) and ``content`` (whether it carried
    text)."""
    from openai import AsyncOpenAI

    async with running(Profile(ttfb=0.05, tokens=5, tokens_per_second=200)) as server:
        base = server.url("/v1")
        client = AsyncOpenAI(base_url=base, api_key="sk-e2e", max_retries=2)
        messages: Any = [{"role": "user", "content": "hi"}]
        for _ in range(3):  # one fresh connection, then pooled
            await client.chat.completions.create(model="m", messages=messages)
        called = time.time_ns()
        stream = await client.chat.completions.create(model="m", messages=messages, stream=True)
        seen: dict[str, Any] = {"called": called, "headers": time.time_ns(), "chunks": []}
        while True:
            asked = time.time_ns()
            try:
                chunk = await stream.__anext__()
            except StopAsyncIteration:
                break
            content = any(choice.delta.content for choice in chunk.choices)
            seen["chunks"].append({"asked": asked, "got": time.time_ns(), "content": content})
        if marks is not None:
            await asyncio.to_thread(marks.write_text, json.dumps(seen))
        server.state.rate_limit_next = 1  # a 429, which the SDK retries after retry-after
        await client.chat.completions.create(model="m", messages=messages)
        await client.close()

        url = server.url()
        body = {"model": "m", "messages": messages}
        for _ in range(2):  # fresh connections: a session each
            async with aiohttp.ClientSession() as session:
                async with session.post(url, json=body) as response:
                    await response.read()
        connector = aiohttp.TCPConnector(limit=2)  # a burst of six through a pool of two
        async with aiohttp.ClientSession(connector=connector) as session:

            async def post() -> None:
                async with session.post(url, json=body) as response:
                    await response.read()

            await asyncio.gather(*(post() for _ in range(6)))
        async with httpx.AsyncClient() as refused:  # nothing listens there
            try:
                await refused.post(f"http://127.0.0.1:{unused_port()}/v1/chat/completions")
            except httpx.ConnectError:
                pass
            else:
                raise AssertionError("the refused connection was accepted")


# -- alerts ---------------------------------------------------------------------------------


#: The alert scenarios, each a host name of its own (server_address): tests/e2e/test_metrics.py.
SCENARIOS = ["healthy", "slow-wait", "slow-stream", "rate-limited", "retried", "fresh", "slow-dns",
             "nearly-out", "pool", "slow-decode"]  # fmt: skip

#: slow-decode.test's models, and their pace (tokens per second): both decode at FAST, then
#: slowing-model at SLOW from the middle of the run.
STEADY_MODEL = "steady-model"
SLOWING_MODEL = "slowing-model"
DECODE_TOKENS = 20
FAST_TOKENS_PER_SECOND = 200.0
SLOW_TOKENS_PER_SECOND = 40.0
#: The line the slow-decode scenario prints at its end (wall-clock times, s): when it started,
#: when slowing-model slowed down, and when it stopped.
DECODE_LINE = "slow-decode: from {start:.3f}, slower from {slower:.3f}, until {end:.3f}"


def _tls() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = trustme.CA()
    server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    # one name each: OpenSSL matches no wildcard directly under a top-level domain (*.test)
    ca.issue_cert(*(f"{name}.test" for name in SCENARIOS)).configure_cert(server_ssl)
    client_ssl = ssl.create_default_context()
    ca.configure_trust(client_ssl)
    return server_ssl, client_ssl


async def alert_scenarios(seconds: float) -> None:
    server_ssl, client_ssl = _tls()
    dns = LocalDNS({"*.test": "127.0.0.1"})
    slow = LocalDNS({"*.test": "127.0.0.1"}, delay=0.6)
    deadline = time.monotonic() + seconds
    try:
        async with llm_server(ssl_context=server_ssl) as server:

            def session(limit: int = 10, nameserver: str = dns.nameserver) -> aiohttp.ClientSession:
                resolver = aiohttp.AsyncResolver(nameservers=[nameserver])
                connector = aiohttp.TCPConnector(limit=limit, resolver=resolver, ssl=client_ssl)
                return aiohttp.ClientSession(connector=connector)

            async def post(client: aiohttp.ClientSession, host: str, **query: Any) -> None:
                async with client.post(server.url(host=host, **query), json={}) as response:
                    await response.read()

            async def loop(pause: float, call: Callable[[], Awaitable[None]]) -> None:
                while time.monotonic() < deadline:
                    await call()
                    await asyncio.sleep(pause)

            async def fresh(host: str, nameserver: str) -> None:
                async with session(nameserver=nameserver) as client:
                    await post(client, host, wait=0.01)

            @llm_latency.retry(attempts=3, base_delay=0.01, max_delay=0.05)
            async def retried(client: aiohttp.ClientSession, scenario: str) -> None:
                # the server fails the first attempt of each scenario: the retry succeeds
                url = server.url(host="retried.test", scenario=scenario, fail=1, retry_ms=10)
                async with client.post(url, json={}, raise_for_status=True) as response:
                    await response.read()

            async def slow_decode(client: aiohttp.ClientSession) -> None:
                profiles = {
                    model: Profile(
                        ttfb=0.01, tokens=DECODE_TOKENS, tokens_per_second=FAST_TOKENS_PER_SECOND
                    )
                    for model in (STEADY_MODEL, SLOWING_MODEL)
                }
                async with (
                    running(profiles[STEADY_MODEL]) as steady_server,
                    running(profiles[SLOWING_MODEL]) as slowing_server,
                ):
                    urls = {
                        STEADY_MODEL: steady_server.url(host="slow-decode.test"),
                        SLOWING_MODEL: slowing_server.url(host="slow-decode.test"),
                    }

                    async def stream(model: str) -> None:
                        body = {
                            "model": model,
                            "messages": [{"role": "user", "content": "tell me a story"}],
                            "stream": True,
                            "stream_options": {"include_usage": True},
                        }
                        async with client.post(urls[model], json=body) as response:
                            await response.read()

                    async def slow_down() -> float:
                        await asyncio.sleep((deadline - time.monotonic()) / 2)
                        slowing_server.state.profile.tokens_per_second = SLOW_TOKENS_PER_SECOND
                        return time.time()

                    start = time.time()
                    slower, *_ = await asyncio.gather(
                        slow_down(),
                        loop(0.1, lambda: stream(STEADY_MODEL)),
                        loop(0.1, lambda: stream(SLOWING_MODEL)),
                    )
                    end = time.time()
                print(DECODE_LINE.format(start=start, slower=slower, end=end), flush=True)

            calls = itertools.count()

            async with session() as pooled, session(limit=1) as narrow, session() as decoding:
                await asyncio.gather(
                    loop(0.5, lambda: post(pooled, "healthy.test", wait=0.02)),
                    loop(0, lambda: post(pooled, "slow-wait.test", wait=31)),
                    loop(0, lambda: post(pooled, "slow-stream.test", wait=11, chunks=3, sse=1)),
                    loop(0.5, lambda: post(pooled, "rate-limited.test", status=429)),
                    loop(0.5, lambda: retried(pooled, f"call-{next(calls)}")),
                    loop(0.5, lambda: fresh("fresh.test", dns.nameserver)),
                    loop(0.5, lambda: fresh("slow-dns.test", slow.nameserver)),
                    loop(
                        0.5,
                        lambda: post(
                            pooled,
                            "nearly-out.test",
                            **{"header_x-ratelimit-remaining-requests": 3},
                        ),
                    ),
                    *(loop(0, lambda: post(narrow, "pool.test", wait=1.0)) for _ in range(3)),
                    slow_decode(decoding),
                )
    finally:
        dns.stop()
        slow.stop()


# -- steady traffic and sampling ------------------------------------------------------------


async def steady(seconds: float, pause: float) -> None:
    calls = 0
    async with llm_server() as server, aiohttp.ClientSession() as client:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            async with client.post(server.url(wait=0.01), json={}) as response:
                await response.read()
            calls += 1
            await asyncio.sleep(pause)
    print(f"calls {calls}", file=sys.stderr, flush=True)


async def sampling(healthy: int, spread: float = 0.0) -> None:
    """The traces of tests/e2e/test_tail_sampling.py; the healthy ones come in batches of 20,
    ``spread`` seconds apart in all (0: at once), beside the slow call's 31 s."""
    tracer = trace.get_tracer("tests.e2e.workload")
    async with llm_server() as server, aiohttp.ClientSession() as client:

        async def post(**query: Any) -> None:
            async with client.post(server.url(**query), json={}) as response:
                await response.read()

        async def batch() -> None:
            batches = healthy // 20
            for number in range(batches):
                if number and spread:
                    await asyncio.sleep(spread / (batches - 1))
                await asyncio.gather(*(post() for _ in range(20)))

        with tracer.start_as_current_span("several calls, one failed"):
            await post()
            await post(status=500)
            await post()
        with tracer.start_as_current_span("several calls, all healthy"):
            for _ in range(3):
                await post()
        await asyncio.gather(post(status=500), post(status=429), post(wait=31), batch())


#: The seed's burst: requests at once, and how long the server takes to answer each (s).
BURST = 30
BURST_WAIT = 0.5


async def bursts(seconds: float, pause: float, limit_per_host: int) -> None:
    rounds = 0
    connector = aiohttp.TCPConnector(limit_per_host=limit_per_host)
    async with llm_server() as server, aiohttp.ClientSession(connector=connector) as client:

        async def one() -> None:
            async with client.post(server.url(wait=BURST_WAIT), json={}) as response:
                await response.read()

        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await asyncio.gather(*(one() for _ in range(BURST)))
            rounds += 1
            await asyncio.sleep(pause)
    print(f"bursts {rounds}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["calls", "alerts", "steady", "sampling", "burst"])
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http")
    parser.add_argument("--endpoint", help="the collector's OTLP host:port")
    parser.add_argument("--service", help="service.name")
    parser.add_argument("--lazy", action="store_true", help="llm-latency sets the SDK up")
    parser.add_argument("--record", type=Path, help="write every span here (JSON lines)")
    parser.add_argument("--stream-marks", type=Path, help="calls: the stream's times (JSON)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--pause", type=float, default=0.2)
    parser.add_argument("--healthy", type=int, default=400)
    parser.add_argument("--limit-per-host", type=int, default=5, help="burst: the pool's size")
    parser.add_argument("--spread", type=float, default=0.0, help="sampling: over S seconds")
    parser.add_argument("--metric-interval-ms", type=int, default=1000)
    args = parser.parse_args(argv)
    providers: tuple[TracerProvider, MeterProvider] | None = None
    if args.lazy:
        llm_latency.instrument()
    else:
        providers = set_up(
            args.protocol, args.endpoint, args.service, args.record, args.metric_interval_ms
        )
        trace.set_tracer_provider(providers[0])
    work: Callable[[], Coroutine[Any, Any, None]] = {
        "calls": lambda: scripted_calls(args.stream_marks),
        "alerts": lambda: alert_scenarios(args.seconds),
        "steady": lambda: steady(args.seconds, args.pause),
        "sampling": lambda: sampling(args.healthy, args.spread),
        "burst": lambda: bursts(args.seconds, args.pause, args.limit_per_host),
    }[args.mode]
    started = time.monotonic()
    try:
        asyncio.run(work())
    finally:
        llm_latency.uninstrument()
        if providers is not None:
            for provider in providers:
                provider.shutdown()
    elapsed = time.monotonic() - started
    # the wall-clock time the work ended: what is left of the process's life is its exit
    print(f"{args.mode} done in {elapsed:.1f} s at {time.time():.3f}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
