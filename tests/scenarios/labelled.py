"""The labelled set: one program per known cause, and what the diagnosis must say of it."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, asynccontextmanager

from llm_latency.testing import LocalDNS, Profile, RunningServer, running
from tests.scenarios.catalog import Program, Run, Scenario, but
from tests.scenarios.first_token import FORMATS, Format, first_token_server, request_body, url_of
from tests.scenarios.peers import DistanceRelay, in_thread, pausing_stream
from tests.scenarios.programs import (
    STREAM,
    StallingResolver,
    aiohttp_requests,
    chat,
    httpx_requests,
    other_tenant,
    requests_requests,
)
from tests.servers import llm_server, unused_port

#: How long the program blocks its own loop in the loop scenarios (s).
BLOCK = 0.4


def trusting(server: RunningServer) -> ssl.SSLContext:
    """A client context that trusts the mock server's CA."""
    return ssl.create_default_context(cafile=str(server.ca_file))


def mock(
    profile: Profile, tls: bool = False, names: tuple[str, ...] = ("localhost", "127.0.0.1")
) -> AbstractContextManager[RunningServer]:
    """The product's mock server, on a loop of its own in a thread."""
    return in_thread(lambda: running(profile, tls=tls, names=names))


# -- healthy ---------------------------------------------------------------------------------


async def healthy_fast(run: Run) -> None:
    with mock(Profile(ttfb=0.02, tokens=5, tokens_per_second=500)) as server:
        await aiohttp_requests(server.url(), 5, concurrent=False, body=STREAM)


async def healthy_slow(run: Run) -> None:
    """A provider that takes its time, streamed: 0.35 s to the first token, 0.5 s of tokens."""
    with mock(Profile(ttfb=0.35, tokens=20, tokens_per_second=40)) as server:
        await aiohttp_requests(server.url(), 3, concurrent=False, body=STREAM)


# -- pools -----------------------------------------------------------------------------------


async def pool_aiohttp(run: Run) -> None:
    with mock(Profile(ttfb=0.1, tokens=1)) as server:
        await aiohttp_requests(server.url(), 8, limit=2)


async def pool_httpx(run: Run) -> None:
    with mock(Profile(ttfb=0.1, tokens=1)) as server:
        await httpx_requests(server.url(), 8, max_connections=2)


async def pool_requests(run: Run) -> None:
    with mock(Profile(ttfb=0.1, tokens=1)) as server:
        await asyncio.to_thread(requests_requests, server.url(), 8, 2)


async def new_connections(run: Run) -> None:
    with mock(Profile(ttfb=0.01, tokens=1, tls_delay=0.03), tls=True) as server:
        await aiohttp_requests(
            server.url(), 5, concurrent=False, fresh=True, ssl_context=trusting(server)
        )


# -- the network -----------------------------------------------------------------------------


async def slow_dns(run: Run) -> None:
    import aiohttp

    dns = LocalDNS({"*.test": "127.0.0.1"}, delay=0.08)
    resolver = aiohttp.AsyncResolver(nameservers=[dns.nameserver])
    try:
        with mock(Profile(ttfb=0.02, tokens=1)) as server:
            for name in ("a.llm.test", "b.llm.test", "c.llm.test"):  # c-ares caches answers
                await aiohttp_requests(server.url(host=name), 1, resolver=resolver)
    finally:
        await resolver.close()
        dns.stop()


@asynccontextmanager
async def far_away(server: RunningServer, one_way: float) -> AsyncIterator[str]:
    async with DistanceRelay(server.port, one_way) as relay:
        yield server.url().replace(f":{server.port}/", f":{relay.port}/")


async def slow_tcp(run: Run) -> None:
    """A server 60 ms away each way: the handshakes take two round trips, the wait one."""
    with mock(Profile(ttfb=0.02, tokens=1), tls=True) as server:
        context = trusting(server)
        with in_thread(lambda: far_away(server, 0.06)) as url:
            await aiohttp_requests(url, 3, ssl_context=context)


async def slow_tls(run: Run) -> None:
    with mock(Profile(ttfb=0.02, tokens=1, tls_delay=0.15), tls=True) as server:
        await aiohttp_requests(server.url(), 3, ssl_context=trusting(server))


async def slow_server(run: Run) -> None:
    with mock(Profile(ttfb=1.0, tokens=5, tokens_per_second=100)) as server:
        await aiohttp_requests(server.url(), 3, body=STREAM)


# -- refusals and failures -------------------------------------------------------------------


async def rate_limited_retried(run: Run) -> None:
    with mock(Profile(ttfb=0.02, tokens=1, rate_limit_every=2, retry_after_ms=60)) as server:
        await aiohttp_requests(server.url(), 4, concurrent=False, retry=True)


async def rate_limited(run: Run) -> None:
    with mock(Profile(ttfb=0.02, tokens=1, rate_limit_every=2)) as server:
        await aiohttp_requests(server.url(), 6, concurrent=False)


async def server_errors_retried(run: Run) -> None:
    with in_thread(llm_server) as server:
        for n in range(3):
            url = server.url(scenario=f"e{n}", fail=1, fail_with=500, wait=0.02)
            await aiohttp_requests(url, 1, retry=True)


async def stream_stall(run: Run) -> None:
    with in_thread(lambda: pausing_stream(1.1)) as url:
        await aiohttp_requests(url, 2)


async def certificate_error(run: Run) -> None:
    with mock(Profile(ttfb=0.02, tokens=1), tls=True) as server:  # its CA is not trusted
        await aiohttp_requests(server.url(), 3, concurrent=False)


async def connection_refused(run: Run) -> None:
    url = f"http://127.0.0.1:{unused_port()}/v1/chat/completions"
    await aiohttp_requests(url, 3, concurrent=False)


async def timeout(run: Run) -> None:
    with mock(Profile(ttfb=1.5, tokens=1)) as server:
        await aiohttp_requests(server.url(), 3, timeout=0.3)


async def reset_mid_stream(run: Run) -> None:
    with in_thread(llm_server) as server:
        url = server.url(chunks=10, gap=0.01, sse=1, reset=5)
        await aiohttp_requests(url, 3, concurrent=False)


# -- the program's own loop ------------------------------------------------------------------


async def loop_blocked_in_wait(run: Run) -> None:
    with mock(Profile(ttfb=0.2, tokens=1)) as server:
        await aiohttp_requests(server.url(), 6, during=lambda: run.stalls.later(0.05, BLOCK))


def _blocked_while_connecting(where: str) -> Program:
    async def program(run: Run) -> None:
        with mock(Profile(ttfb=0.05, tokens=1)) as server:
            resolver = StallingResolver(run.stalls, where, BLOCK)
            await aiohttp_requests(server.url(host="llm.test"), 6, resolver=resolver)

    return program


async def loop_blocked_in_tls(run: Run) -> None:
    """The server holds each ClientHello 30 ms; the loop blocks 10 ms in, mid-handshake."""
    profile = Profile(ttfb=0.05, tokens=1, tls_delay=0.03)
    with mock(profile, tls=True, names=("llm.test",)) as server:
        resolver = StallingResolver(run.stalls, "none", 0.0)
        await aiohttp_requests(
            server.url(host="llm.test"), 3, ssl_context=trusting(server), resolver=resolver,
            during=lambda: run.stalls.later(0.01, BLOCK),
        )  # fmt: skip


async def loop_blocked_in_queue(run: Run) -> None:
    """Six requests through two connections; the loop blocks while four wait for one."""
    with mock(Profile(ttfb=0.03, tokens=1)) as server:
        await aiohttp_requests(
            server.url(), 6, limit=2, during=lambda: run.stalls.later(0.01, BLOCK)
        )


# -- tokens ----------------------------------------------------------------------------------


async def long_answer(run: Run) -> None:
    """600-token answers at 500 tokens/s, read whole: 1.2 s of decoding each."""
    with mock(Profile(ttfb=0.05, tokens=600, tokens_per_second=500)) as server:
        await aiohttp_requests(server.url(), 3, body=chat(20, 600, stream=False))


async def long_answer_streamed(run: Run) -> None:
    """400-token answers at 400 tokens/s, streamed with their usage."""
    with mock(Profile(ttfb=0.05, tokens=400, tokens_per_second=400)) as server:
        await aiohttp_requests(server.url(), 3, body=chat(20, 400))


async def long_prompt(run: Run) -> None:
    """Prompts of 500 to 2500 words (the mock's tokens), 0.4 ms of prefill each: the first token
    after 0.25 to 1.05 s; short answers."""
    profile = Profile(ttfb=0.05, prefill_per_token=0.0004, tokens=10, tokens_per_second=200)
    with mock(profile) as server:
        await aiohttp_requests(server.url(), 5, body=lambda i: chat(500 * (i + 1), 10))


async def provider_queue(run: Run) -> None:
    """One generation slot: three requests on an idle server, then three that each arrive while
    another tenant's 100-token answer (0.5 s) holds the slot."""
    profile = Profile(ttfb=0.05, tokens=100, tokens_per_second=200, slots=1)
    with mock(profile) as server:
        await aiohttp_requests(server.url(), 3, concurrent=False, body=chat(30, 12))
        for _ in range(3):
            tenant = await other_tenant(server.port, 100)
            await aiohttp_requests(server.url(), 1, body=chat(30, 12))
            await tenant


async def slow_generation(run: Run) -> None:
    """30-token answers at 200 tokens/s, then the server slows to 20 tokens/s."""
    with mock(Profile(ttfb=0.05, tokens=30, tokens_per_second=200)) as server:
        await aiohttp_requests(server.url(), 3, concurrent=False, body=chat(30, 30))
        server.state.profile.tokens_per_second = 20
        await aiohttp_requests(server.url(), 3, body=chat(30, 30))


async def small_prompts(run: Run) -> None:
    """Ten small prompts, one after another, each paying 120 ms before its few tokens."""
    with mock(Profile(ttfb=0.12, tokens=8, tokens_per_second=200)) as server:
        await aiohttp_requests(
            server.url(), 10, concurrent=False,
            body=lambda i: chat(10 + 3 * i, 2 + i % 7, stream=False),
        )  # fmt: skip


def _queued_after_control_events(fmt: Format) -> Program:
    """Eight streams at once, three of them held 1.5 s after their control events (the
    provider's queue, a long prefill, hidden reasoning), before the first token."""

    async def program(run: Run) -> None:
        with in_thread(first_token_server) as base:
            body = request_body(fmt)
            await asyncio.gather(
                aiohttp_requests(url_of(base, fmt), 5, body=body),
                aiohttp_requests(url_of(base, fmt, wait=1.5), 3, body=body),
            )

    return program


def _stalled_mid_stream(fmt: Format) -> Program:
    """Two streams that stop for 1.1 s after ten of their tokens."""

    async def program(run: Run) -> None:
        with in_thread(first_token_server) as base:
            await aiohttp_requests(url_of(base, fmt, pause=1.1, at=10), 2, body=request_body(fmt))

    return program


def _first_token_scenarios() -> tuple[Scenario, ...]:
    """Per stream format: the wait before the first token is the provider's queue, never a
    stall; a pause between two tokens is one."""
    return tuple(
        scenario
        for fmt in FORMATS
        for scenario in (
            Scenario(f"queued-{fmt.name}", f"{fmt.name}: 3 of 8 held 1.5 s before the first "
                     "token", "provider-queue", but("provider-queue"),
                     _queued_after_control_events(fmt), saving=(1.2, 1.6)),
            Scenario(f"stall-{fmt.name}", f"{fmt.name}: 1.1 s pause after ten tokens",
                     "stream-stall", but("stream-stall"), _stalled_mid_stream(fmt)),
        )
    )  # fmt: skip


# -- two endpoints ---------------------------------------------------------------------------


async def compare_server_time(run: Run) -> None:
    with mock(Profile(ttfb=0.15, tokens=1)) as one, mock(Profile(ttfb=0.45, tokens=1)) as two:
        run.endpoints.update(E1=one.port, E2=two.port)
        for server in (one, two):
            await aiohttp_requests(server.url(), 4, concurrent=False)


async def compare_setup(run: Run) -> None:
    fast, slow = Profile(ttfb=0.05, tokens=1), Profile(ttfb=0.05, tokens=1, tls_delay=0.2)
    with mock(fast, tls=True) as one, mock(slow, tls=True) as two:
        run.endpoints.update(E1=one.port, E2=two.port)
        for server in (one, two):
            await aiohttp_requests(
                server.url(), 4, concurrent=False, fresh=True, ssl_context=trusting(server)
            )


NETWORK = ("slow-dns", "slow-connect", "new-connections", "server-time", "network-overhead")

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("healthy-fast", "a fast provider", None, but(), healthy_fast),
    Scenario("healthy-slow", "a slow but healthy provider", None, but(), healthy_slow),
    Scenario("pool-aiohttp", "aiohttp pool of 2, 8 at once", "pool-queue",
             but("pool-queue"), pool_aiohttp, fix_mentions="TCPConnector(limit="),
    Scenario("pool-httpx", "httpx pool of 2, 8 at once", "pool-queue",
             but("pool-queue"), pool_httpx, fix_mentions="Limits(max_connections="),
    Scenario("pool-requests", "requests pool of 2, 8 at once", "pool-queue",
             but("pool-queue"), pool_requests, fix_mentions="pool_maxsize="),
    Scenario("slow-dns", "DNS answers in 80 ms", "slow-dns", but("slow-dns"), slow_dns),
    Scenario("slow-tcp", "a server 60 ms away", "slow-connect",
             but("slow-connect", "network-overhead"), slow_tcp),
    Scenario("slow-tls", "TLS handshake 150 ms", "slow-connect", but("slow-connect"), slow_tls),
    Scenario("slow-server", "1 s of server time", "server-time", but("server-time"), slow_server),
    Scenario("rate-limited-retried", "every 2nd request 429, retried", "rate-limits",
             but("rate-limits"), rate_limited_retried),
    Scenario("rate-limited", "every 2nd request 429, not retried", "rate-limits",
             but("rate-limits"), rate_limited),
    Scenario("5xx-retried", "a 500 per call, retried", "server-errors",
             but("server-errors"), server_errors_retried),
    Scenario("stream-stall", "1.1 s pause mid-stream", "stream-stall",
             but("stream-stall"), stream_stall),
    Scenario("certificate-error", "the CA is not trusted", "tls-failure",
             but("tls-failure"), certificate_error),
    Scenario("connection-refused", "nothing listens", "connect-failure",
             but("connect-failure"), connection_refused),
    Scenario("timeout", "1.5 s answers, 0.3 s timeout", "timeouts", but("timeouts"), timeout),
    Scenario("reset-mid-stream", "connection cut after 5 chunks", "connection-reset",
             but("connection-reset"), reset_mid_stream),
    Scenario("new-connections", "a new session per request", "new-connections",
             but("new-connections"), new_connections),
    Scenario("loop-blocked-wait", "loop blocked 0.4 s in wait", "event-loop-lag",
             frozenset(NETWORK), loop_blocked_in_wait),
    Scenario("loop-blocked-dns", "loop blocked 0.4 s in dns", "event-loop-lag",
             frozenset(NETWORK), _blocked_while_connecting("dns"),
             needs_phase_lag=True),
    Scenario("loop-blocked-connect", "loop blocked 0.4 s in connect", "event-loop-lag",
             frozenset(NETWORK), _blocked_while_connecting("connect"),
             needs_phase_lag=True),
    Scenario("loop-blocked-tls", "loop blocked 0.4 s in tls", "event-loop-lag",
             frozenset(NETWORK), loop_blocked_in_tls, needs_phase_lag=True),
    Scenario("loop-blocked-queue", "loop blocked 0.4 s in queue", "event-loop-lag",
             frozenset(NETWORK), loop_blocked_in_queue, needs_phase_lag=True),
    Scenario("long-answer", "600-token answers at 500 tokens/s, not streamed", "long-answer",
             but("long-answer"), long_answer, fix_mentions="max_tokens",
             saving=(0.55, 1.0)),  # half of 600 tokens at 2 ms (a bound: with the 50 ms)
    Scenario("long-answer-streamed", "400-token answers at 400 tokens/s, streamed",
             "long-answer", but("long-answer"), long_answer_streamed,
             fix_mentions="max_tokens", saving=(0.45, 2.0)),  # half of 400 at 2.5 ms or more
    Scenario("long-prompt", "prompts of 500 to 2500 tokens, 0.4 ms each", "long-prompt",
             but("long-prompt"), long_prompt, fix_mentions="cache_control",
             saving=(0.25, 0.6)),  # half of 1750 tokens at 0.4 ms
    Scenario("provider-queue", "1 slot, held 0.5 s by another tenant", "provider-queue",
             but("provider-queue"), provider_queue, fix_mentions="llm-latency watch",
             saving=(0.35, 1.5)),  # what was left of the tenant's 0.5 s
    Scenario("slow-generation", "200 then 20 tokens/s", "slow-generation",
             but("slow-generation"), slow_generation, fix_mentions="llm-latency watch",
             saving=(1.0, 3.0)),  # 29 tokens 45 ms slower
    Scenario("small-prompts-one-by-one", "10 small prompts one by one, 120 ms each",
             "small-prompts-one-by-one", but("small-prompts-one-by-one"), small_prompts,
             fix_mentions="max_tokens to at least", saving=(0.09, 0.3)),  # the 120 ms
    Scenario("compare-server-time", "E2's server 300 ms slower", "gap: wait",
             but("gap: wait"), compare_server_time),
    Scenario("compare-setup", "E2's TLS 200 ms slower, new connections", "gap: tls",
             but("gap: tls"), compare_setup),
    *_first_token_scenarios(),
)  # fmt: skip
