"""The programs of the applied scenarios (:mod:`tests.scenarios.applied`), each against real
peers on loopback that it starts and stops itself, so that every run begins alike: a distant
HTTPS server, a pool too small for a burst, a server that rate-limits, a slow resolver. Each
takes its client's configuration and the tracer of its own spans; :func:`run` runs one
instrumented and gives back its calls."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine

import aiohttp
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

import llm_latency
from llm_latency.diagnosis import Call, as_calls, from_readable_spans
from llm_latency.testing import LocalDNS, Profile
from tests.scenarios.client_programs import Config, Target, aiohttp_burst, aiohttp_retried, run_sync
from tests.scenarios.labelled import far_away, mock
from tests.scenarios.peers import in_thread

#: A program: its configuration and the tracer of its own spans in, nothing out.
Program = Callable[[Config, Tracer], Coroutine[None, None, None]]


def run(program: Program, config: Config) -> list[Call]:
    """``program`` run once, instrumented, on a loop of its own: its calls."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    llm_latency.instrument(tracer_provider=provider, configure=False)
    try:
        asyncio.run(program(config, provider.get_tracer("program")))
    finally:
        llm_latency.uninstrument()
    return as_calls(from_readable_spans(exporter.get_finished_spans()))


# -- the programs --------------------------------------------------------------------------------

#: One way to the distant server (s): each handshake waits two round trips more, each request
#: one.
DISTANCE = 0.03
#: The calls of the programs that send one after another, and of those that send at once.
SEQUENTIAL, AT_ONCE = 6, 12


def distant(send: Callable[[Config, Target, int], object], sync: bool) -> Program:
    """A program that sends :data:`SEQUENTIAL` calls with ``send`` to an HTTPS server
    :data:`DISTANCE` away."""

    async def program(config: Config, tracer: Tracer) -> None:
        with mock(Profile(ttfb=0.02, tokens=1), tls=True) as server:
            with in_thread(lambda: far_away(server, DISTANCE)) as url:
                target = Target(url, str(server.ca_file), tracer)
                if sync:
                    await run_sync(send, config, target, SEQUENTIAL)
                else:
                    result = send(config, target, SEQUENTIAL)
                    assert isinstance(result, Coroutine)
                    await result

    return program


def pooled(send: Callable[[Config, Target, int], object], sync: bool) -> Program:
    """A program that sends :data:`AT_ONCE` calls at once with ``send`` to an HTTPS server
    that answers in 150 ms and takes 50 ms more over each TLS handshake."""

    async def program(config: Config, tracer: Tracer) -> None:
        with mock(Profile(ttfb=0.15, tokens=1, tls_delay=0.05), tls=True) as server:
            target = Target(server.url(), str(server.ca_file), tracer)
            if sync:
                await run_sync(send, config, target, AT_ONCE)
            else:
                result = send(config, target, AT_ONCE)
                assert isinstance(result, Coroutine)
                await result

    return program


async def rate_limited(config: Config, tracer: Tracer) -> None:
    """Four calls one after another to a server that refuses every second request (429, with
    retry-after-ms 50), each in a span of the program's own."""
    profile = Profile(ttfb=0.02, tokens=1, rate_limit_every=2, retry_after_ms=50)
    with mock(profile) as server:
        await aiohttp_retried(config, Target(server.url(), None, tracer), 4)


async def dns_burst(config: Config, tracer: Tracer) -> None:
    """:data:`AT_ONCE` calls at once to a name whose resolver answers in 100 ms."""
    dns = LocalDNS({"*.test": "127.0.0.1"}, delay=0.1)
    resolver = aiohttp.AsyncResolver(nameservers=[dns.nameserver])
    try:
        with mock(Profile(ttfb=0.05, tokens=1)) as server:
            target = Target(server.url(host="llm.test"), None, tracer)
            await aiohttp_burst(config, target, AT_ONCE, resolver)
    finally:
        await resolver.close()
        dns.stop()
