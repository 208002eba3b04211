"""The diagnosis engine: each rule on a real scenario that produces it, and on one that must not.

Every scenario runs instrumented aiohttp against a loopback server (the tests' LLM server, the
mock server for TLS handshakes, the local DNS server), then diagnoses the exported spans: the
same path as ``probe``, ``explain`` and the development exporter.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

import llm_latency
from llm_latency import Finding, diagnose
from llm_latency.diagnosis import (
    Attempt,
    Call,
    SpanRecord,
    advice,
    baselines,
    calls_from_spans,
    connections,
    dns,
    failures,
    from_readable_spans,
    grouping,
    measured,
    pool,
    rate_limits,
    rules,
    seen,
    tokens,
)
from llm_latency.diagnosis.findings import P50, WALL, duration, percentile
from llm_latency.diagnosis.rate_limits import RETRY_WAIT_MIN_EXCESS, RETRY_WAIT_MIN_EXCESS_SHARE
from llm_latency.diagnosis.records import Phase
from llm_latency.testing import LocalDNS, Profile, running
from tests.attributes import attributes, float_attr
from tests.checks import EARLY, TRIES
from tests.command_line import mock_server
from tests.conftest import Telemetry
from tests.cpu_waits import collector_pauses, machine_waits
from tests.servers import LLMServer


def rules_found(findings: list[Finding]) -> list[str]:
    return [f.rule for f in findings]


def stall(telemetry: Telemetry, *phases: str) -> float:
    """The most of ``phases`` (span names) any attempt charged to its own loop's stall (s): the
    diagnosis takes it off the network's time, so a bound on what was injected allows for it (on
    a loaded machine the process is descheduled, and the lag is an upper bound)."""
    by_attempt: dict[int, float] = {}
    for span in telemetry.spans():
        if span.name in phases and span.parent is not None:
            lag = (span.attributes or {}).get("llm_latency.event_loop.lag", 0.0)
            assert isinstance(lag, float | int)
            by_attempt[span.parent.span_id] = by_attempt.get(span.parent.span_id, 0.0) + lag
    return max(by_attempt.values(), default=0.0)


def finding(findings: list[Finding], rule: str) -> Finding:
    (found,) = [f for f in findings if f.rule == rule]
    assert 0 < found.evidence.share <= 1, found.evidence  # a share of the time, never more
    assert found.evidence.count <= found.evidence.requests
    return found


async def run(
    n: int,
    url: str,
    *,
    concurrent: bool = False,
    session_per_request: bool = False,
    **connector: Any,
) -> None:
    """``n`` POSTs to ``url``, one after another or all at once, on one session or a fresh one
    (and a fresh connection) per request."""

    async def one(session: aiohttp.ClientSession) -> None:
        async with session.post(url, json={"model": "m"}) as response:
            await response.read()

    async def fresh() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(**connector)) as session:
            await one(session)

    if session_per_request:
        jobs: list[Callable[[], Awaitable[None]]] = [fresh] * n
        if concurrent:
            await asyncio.gather(*(job() for job in jobs))
        else:
            for job in jobs:
                await job()
        return
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(**connector)) as session:
        if concurrent:
            await asyncio.gather(*(one(session) for _ in range(n)))
        else:
            for _ in range(n):
                await one(session)


# -- new connections -------------------------------------------------------------------------


@pytest.mark.parametrize("pooled", [False, True], ids=["fresh", "pooled"])
async def test_new_connections(telemetry: Telemetry, pooled: bool) -> None:
    """Six calls one after another, a new session each: the five connections one reused client
    would not open are the finding. Calls that keep the program busy (a batch: their time at
    least BATCH_MIN_BUSY of the wall time) save their wall time, five calls' worth; with more
    time between them they save each call's p50, over the six. What runs between two calls
    (the sessions' set-up and close) is short, but on a loaded machine this process waits for a
    CPU there too: a run whose idle time exceeds a batch's by no more than what the machine
    measurably took meanwhile runs again, up to TRIES times, and any other runs fail at once;
    when every run was held, the last one's saving must be the p50's."""
    for _ in range(TRIES):
        telemetry.exporter.clear()  # a run again: only its own spans
        with machine_waits(os.getpid()) as waited, collector_pauses() as collected:
            profile = Profile(ttfb=0.01, tokens=1, tls_delay=0.03)
            async with running(profile, tls=True) as mock:
                assert mock.ca_file is not None
                context = ssl.create_default_context(cafile=str(mock.ca_file))
                await run(6, mock.url(), session_per_request=not pooled, ssl=context)
        calls = _calls(telemetry)
        wall = seen.wall_time(calls)
        idle = wall - sum(c.duration for c in calls)  # one after another: no overlap
        beyond = idle - (1 - seen.BATCH_MIN_BUSY) * wall
        took = waited.peers + collected.seconds  # this thread is one of the process's
        if pooled or beyond <= 0 or beyond > took:
            break
    findings = diagnose(telemetry.spans())
    if pooled:
        assert "new-connections" not in rules_found(findings)
        return
    assert beyond <= took, (
        f"{idle:.3f} s of {wall:.3f} s between the calls; {waited}, the garbage collector ran "
        f"{collected.seconds:.3f} s"
    )
    found = finding(findings, "new-connections")
    # One connection was needed (sequential requests); the other five paid DNS+TCP+TLS again.
    assert found.evidence.count == 5 and found.evidence.requests == 6
    assert found.evidence.phase == "dns+connect+tls"
    # the handshake the server held back, less what the loop's stall was charged with
    assert found.evidence.p50 >= 0.03 - stall(telemetry, "http.dns", "http.connect", "http.tls")
    assert found.saving is not None
    if beyond <= 0:  # a batch: its wall time, shorter by the five set-ups
        assert found.saving.kind == WALL and found.saving.requests == 5
        assert found.saving.p50 == found.evidence.p50
    else:  # the machine's gaps: each call's p50, over the six calls
        assert found.saving.kind == P50 and found.saving.requests == 6
        setups = [a.connection_setup for c in calls for a in c.attempts]
        assert 0 < found.saving.p50 <= max(setups)
    assert "reuse one client" in found.fix


async def test_concurrent_requests_need_their_own_connections(telemetry: Telemetry) -> None:
    """Six at once on one session open six connections: the concurrency needs them."""
    async with running(Profile(ttfb=0.05, tokens=1, tls_delay=0.03), tls=True) as mock:
        import ssl

        context = ssl.create_default_context(cafile=str(mock.ca_file))
        await run(6, mock.url(), concurrent=True, ssl=context)
    assert sum(a.opened_connection for c in _calls(telemetry) for a in c.attempts) == 6
    assert "new-connections" not in rules_found(diagnose(telemetry.spans()))


# -- the pool's queue ------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [2, 8])
async def test_pool_queue(telemetry: Telemetry, server: LLMServer, limit: int) -> None:
    await run(8, server.url(wait=0.1), concurrent=True, limit=limit)
    findings = diagnose(telemetry.spans())
    if limit == 8:
        assert "pool-queue" not in rules_found(findings)
        return
    found = finding(findings, "pool-queue")
    # 8 at once through 2 connections: 6 waited, in three rounds of about 0.1 s.
    assert found.evidence.count == 6
    assert 0.08 < found.evidence.p50 < 0.3
    assert "from 2 to 8" in found.fix
    # What the batch's wall time loses: three of its four rounds of 0.1 s (a pool of 8 serves
    # them in one), from a replay of the requests through each pool.
    assert found.saving is not None and found.saving.kind == "wall"
    assert found.saving.seen is not None and 0.25 < found.saving.seen < 0.5
    # The largest saving comes first.
    assert findings[0].rule == "pool-queue"


# -- DNS, TCP and TLS ------------------------------------------------------------------------


@pytest.mark.parametrize("delay", [0.08, 0.0])
async def test_slow_dns(
    telemetry: Telemetry, server: LLMServer, dns: LocalDNS, delay: float
) -> None:
    dns.resolver.delay = delay
    resolver = aiohttp.AsyncResolver(nameservers=[dns.nameserver])
    try:
        for name in ("a.llm.test", "b.llm.test"):  # two names: c-ares caches answers itself
            await run(1, server.url(host=name), resolver=resolver)
    finally:
        await resolver.close()
    findings = diagnose(telemetry.spans())
    if not delay:
        assert "slow-dns" not in rules_found(findings)
        return
    found = finding(findings, "slow-dns")
    assert found.evidence.count == 2
    assert found.evidence.p50 >= delay - stall(telemetry, "http.dns")
    assert "caching resolver" in found.fix


@pytest.mark.parametrize("tls_delay", [0.15, 0.0])
async def test_slow_connect(telemetry: Telemetry, tls_delay: float) -> None:
    async with running(Profile(ttfb=0.01, tokens=1, tls_delay=tls_delay), tls=True) as mock:
        import ssl

        context = ssl.create_default_context(cafile=str(mock.ca_file))
        await run(3, mock.url(), concurrent=True, ssl=context)
    findings = diagnose(telemetry.spans())
    if not tls_delay:
        assert "slow-connect" not in rules_found(findings)
        return
    found = finding(findings, "slow-connect")
    assert found.evidence.count == 3  # three at once: three connections
    assert found.evidence.p50 >= tls_delay - stall(telemetry, "http.connect", "http.tls")
    assert "nearer" in found.fix
    assert "new-connections" not in rules_found(findings)


async def test_one_slow_handshake_is_not_enough_evidence(telemetry: Telemetry) -> None:
    """One request that paid a slow handshake, the next pooled: a finding needs at least
    two requests that show it, and says so."""
    async with running(Profile(ttfb=0.01, tokens=1, tls_delay=0.15), tls=True) as mock:
        import ssl

        context = ssl.create_default_context(cafile=str(mock.ca_file))
        await run(2, mock.url(), ssl=context)
    assert diagnose(telemetry.spans()) == []


# -- the server's time and the network's -----------------------------------------------------


async def test_server_time_dominates(telemetry: Telemetry, server: LLMServer) -> None:
    await run(3, server.url(wait=0.6))
    findings = diagnose(telemetry.spans())
    found = finding(findings, "server-time")
    assert found.saving is None  # only the provider's side can shorten it
    assert 0.6 <= found.evidence.p50 < 0.62
    assert "streaming" in found.fix  # the answers were not streamed
    assert "network-overhead" not in rules_found(findings)


#: A run the machine kept the test's loop from a CPU for this long (s), a tenth of the 0.2 s
#: injected, or more, and that missed, runs again (up to three times).
OVERHEAD_DISTURBED = 0.02


async def test_network_overhead(telemetry: Telemetry, server: LLMServer) -> None:
    """A server that took 0.3 s to answer but reports 0.1 s: 0.2 s the network and edge's.

    The server runs on the test's own loop: on a loaded machine that kept the loop's thread
    from a CPU, it answers late and the answer is read late, and that time is the machine's
    (``llm_latency.event_loop.descheduled``), not the network's. A run that misses while the
    machine did that runs again; a miss in a run it left alone fails at once."""
    for _ in range(3):
        telemetry.exporter.clear()
        await run(3, server.url(wait=0.3, **{"header_openai-processing-ms": "100"}))
        findings = diagnose(telemetry.spans())
        # The 0.2 s the server held back, less what the loop's lateness in the window took of
        # it (the program's lag, the machine's wait for a CPU: a loaded machine's): the
        # overhead, the lag and the wait together are at least the 0.2 s.
        attempts = [a for call in _calls(telemetry) for a in call.attempts]
        for attempt in attempts:
            assert attempt.network_overhead is not None
            lag, descheduled = attempt.event_loop_lag or 0.0, attempt.descheduled or 0.0
            assert attempt.network_overhead + lag + descheduled > 0.19
            assert attempt.network_overhead < 0.25 + lag
        overheads = [f.evidence.p50 for f in findings if f.rule == "network-overhead"]
        if overheads and overheads[0] > 0.1:
            break
        if max(a.descheduled or 0.0 for a in attempts) < OVERHEAD_DISTURBED:
            break
    found = finding(findings, "network-overhead")
    assert found.evidence.p50 > 0.1
    assert found.saving is not None and found.saving.requests == 3
    assert "probe URL1 URL2" in found.fix
    assert "server-time" not in rules_found(findings)  # 0.1 of 0.3 s is not most of the wait


# -- rate limits and retries -----------------------------------------------------------------


#: What the rate-limited server asks the client to wait (retry-after-ms).
RETRY_AFTER = 0.08


@pytest.mark.parametrize("failures", [2, 0])
async def test_rate_limits(telemetry: Telemetry, server: LLMServer, failures: int) -> None:
    """llm_latency.retry waits what the server asked, so the finding is the refusals and their
    waits. A wait that woke later than asked by the rule's margin makes the time beyond
    retry-after the finding instead: on a loaded machine the loop's thread kept from a CPU, or
    this process held by its garbage collector, wakes that late. A run whose waits were late by
    no more than what the machine measurably took meanwhile runs again, up to TRIES times, and
    a wait later than that fails at once (the retry slept longer than asked); when every run
    woke late on the machine's account, the last one's finding must be the waits'."""

    @llm_latency.retry(attempts=4, base_delay=0.01)
    async def complete(session: aiohttp.ClientSession, url: str) -> None:
        async with session.post(url, json={}, raise_for_status=True) as response:
            await response.read()

    margin = max(RETRY_WAIT_MIN_EXCESS, RETRY_WAIT_MIN_EXCESS_SHARE * RETRY_AFTER)
    for run in range(TRIES):
        telemetry.exporter.clear()  # a run again: only its own spans
        url = server.url(
            scenario=f"rl{failures}-{run}", fail=failures, retry_ms=int(RETRY_AFTER * 1000)
        )
        with machine_waits(os.getpid()) as waited, collector_pauses() as collected:
            async with aiohttp.ClientSession() as session:
                await complete(session, url)
                await complete(session, url)  # a second call, not retried
        calls = _calls(telemetry)
        beyond = [b.duration - RETRY_AFTER for c in calls for b in c.backoffs]
        late = max(beyond, default=0.0)
        took = waited.peers + collected.seconds  # this thread is one of the process's
        if late < margin or late > took:
            break
    assert late < margin or late <= took, (
        f"a retry woke {late:.3f} s after retry-after; {waited}, the garbage collector ran "
        f"{collected.seconds:.3f} s"
    )
    findings = diagnose(telemetry.spans())
    if not failures:
        assert "rate-limits" not in rules_found(findings)
        return
    assert [len(c.attempts) for c in calls] == [3, 1]
    assert len(calls[0].backoffs) == 2
    found = finding(findings, "rate-limits")
    assert found.cause.startswith("2 of 4 attempts were rate limited (429) and 2 were retries")
    assert found.saving is not None
    if late < margin:
        # The call that retried lost its two 429s and two backoffs of at least 80 ms each.
        assert found.saving.requests == 1
        assert found.saving.p50 >= 2 * RETRY_AFTER
        assert "retry-after" in found.fix
    else:  # the machine's late wake-ups: the time beyond retry-after is what to save
        assert "of the waits before them lasted" in found.cause
        gone = sum(by for by in beyond if by >= margin)
        assert found.evidence.count == 1 and found.evidence.p50 == pytest.approx(gone)
        assert found.fix.startswith("honour retry-after")


# -- streaming -------------------------------------------------------------------------------


async def test_not_streamed(telemetry: Telemetry, server: LLMServer) -> None:
    """A long answer read whole, next to streamed ones whose first chunk came after 0.1 s."""
    await run(2, server.url(wait=1.05))
    await run(2, server.url(wait=0.1, chunks=3, sse=1))
    found = finding(diagnose(telemetry.spans()), "not-streamed")
    assert found.evidence.count == 2 and found.evidence.p50 >= 1.05
    assert found.saving is not None
    # The whole answer took about 1.05 s; a stream's first chunk came after about 0.1 s.
    assert 0.85 < found.saving.p50 < 1.0


async def test_streamed_answers_are_not_told_to_stream(
    telemetry: Telemetry, server: LLMServer
) -> None:
    await run(2, server.url(wait=1.05, chunks=3, sse=1))
    assert "not-streamed" not in rules_found(diagnose(telemetry.spans()))


async def _stall_server(stall: float) -> tuple[web.AppRunner, str]:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for i in range(20):
            await asyncio.sleep(stall if i == 10 else 0.01)
            await response.write(f"data: {json.dumps({'n': i})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v1/chat/completions"


@pytest.mark.parametrize("stall", [1.1, 0.01])
async def test_stream_stall(telemetry: Telemetry, stall: float) -> None:
    runner, url = await _stall_server(stall)
    try:
        await run(1, url)
    finally:
        await runner.cleanup()
    findings = diagnose(telemetry.spans())
    if stall < 1:
        assert "stream-stall" not in rules_found(findings)
        return
    found = finding(findings, "stream-stall")
    # The pause is the server's, but for what a late loop (a loaded machine) held the next
    # chunk back: that part is the attempt's lag, out of the stream's longest gap.
    (attempt,) = telemetry.attempts()
    lag = (attempt.attributes or {}).get("llm_latency.event_loop.lag", 0.0)
    assert isinstance(lag, float)
    assert found.evidence.count == 1 and found.evidence.p50 + lag >= 1.1
    assert found.saving is not None and found.saving.p50 > 1.0


# -- the program's own event loop ------------------------------------------------------------


SERVER_TIME = "llm_latency.server.processing_time"


@pytest.mark.parametrize("blocked", [True, False], ids=["blocked loop", "idle loop"])
async def test_event_loop_lag(telemetry: Telemetry, blocked: bool) -> None:
    """The mock server runs in its own process: blocking this loop does not delay it."""
    with mock_server("--ttfb", "0.2", "--tokens", "1", "--tokens-per-second", "1000") as mock:
        async with aiohttp.ClientSession() as session:

            async def one() -> None:
                async with session.post(mock.url, json={}) as response:
                    await response.read()

            tasks = [asyncio.create_task(one()) for _ in range(10)]
            if blocked:
                await asyncio.sleep(0.1)
                time.sleep(0.35)  # noqa: ASYNC251 - the program's own stall under test
            await asyncio.gather(*tasks)
    findings = diagnose(telemetry.spans())
    if not blocked:
        assert "event-loop-lag" not in rules_found(findings)
        return
    found = finding(findings, "event-loop-lag")
    assert found.evidence.count == 10 and found.evidence.p50 > 0.15
    assert "the event loop was blocked for" in found.cause
    # openai-processing-ms: the mock server's own time, the 0.2 s it injected and what a loaded
    # machine added to its process; the cause names the p50 of what the server said
    servers = [float_attr(span, SERVER_TIME) for span in telemetry.spans()
               if SERVER_TIME in attributes(span)]  # fmt: skip
    assert len(servers) == 10 and min(servers) >= 0.2 - EARLY, servers
    said = f"the provider answered in {duration(percentile(servers, 50))} at p50"
    assert said in found.cause, (servers, found.cause)
    assert "the rest is this program" in found.cause
    assert "off the event loop" in found.fix


# -- a healthy run, and the records behind the rules -----------------------------------------


async def test_a_healthy_run_has_no_findings(telemetry: Telemetry, server: LLMServer) -> None:
    await run(5, server.url(wait=0.02))
    assert diagnose(telemetry.spans()) == []


async def test_a_single_healthy_call_gets_no_finding(
    telemetry: Telemetry, server: LLMServer
) -> None:
    """One 700 ms answer is no evidence for a server-time finding ("1 of 1 requests")."""
    await run(1, server.url(wait=0.7))
    assert diagnose(telemetry.spans()) == []


def _calls(telemetry: Telemetry) -> list[Call]:
    return calls_from_spans(from_readable_spans(telemetry.spans()))


async def test_calls_group_retries_and_split_independent_requests(
    telemetry: Telemetry, server: LLMServer
) -> None:
    """Under one program span: a call retried once, then two separate requests."""
    from opentelemetry import trace

    tracer = trace.get_tracer("program", tracer_provider=telemetry.tracer_provider)
    url = server.url(scenario="grouping", fail=1, retry_ms=20)

    @llm_latency.retry(attempts=3, base_delay=0.01)
    async def complete(session: aiohttp.ClientSession) -> None:
        async with session.post(url, json={}, raise_for_status=True) as response:
            await response.read()

    with tracer.start_as_current_span("handler"):
        async with aiohttp.ClientSession() as session:
            await complete(session)
            for _ in range(2):
                async with session.get(server.url()) as response:
                    await response.read()
    calls = _calls(telemetry)
    assert [len(c.attempts) for c in calls] == [2, 1, 1]
    assert [len(c.backoffs) for c in calls] == [1, 0, 0]
    assert [a.resend_count for a in calls[0].attempts] == [0, 1]
    assert calls[0].attempts[0].status == 429 and calls[0].attempts[1].succeeded
    assert calls[0].duration >= calls[0].backoff_time + sum(a.duration for a in calls[0].attempts)
    assert calls[1].attempts[0].request_id == "req_test_123"


def test_diagnose_refuses_what_it_cannot_read() -> None:
    with pytest.raises(TypeError, match="cannot diagnose a str"):
        diagnose(["not a span"])


def test_records_in_any_mix() -> None:
    """Attempts and SpanRecords diagnose like spans (what ``explain`` reads from a file)."""
    record = SpanRecord(
        trace_id="1" * 32,
        span_id="2" * 16,
        parent_id=None,
        name="POST",
        kind="CLIENT",
        start_ns=0,
        end_ns=2_000_000_000,
        attributes={
            "url.full": "http://h/v1/chat/completions",
            "llm_latency.stream.events": 3,
            "http.response.status_code": 200,
        },
        scope="llm_latency",
    )
    phase = SpanRecord(
        "1" * 32, "3" * 16, "2" * 16, "http.wait", "INTERNAL", 0, 1_500_000_000,
        {"llm_latency.phase": "wait"}, "llm_latency",
    )  # fmt: skip
    (attempt,) = calls_from_spans([record, phase])[0].attempts
    assert attempt.phase("wait") == 1.5 and attempt.streamed
    assert isinstance(attempt, Attempt)
    assert diagnose([attempt]) == diagnose([record, phase]) == []


def test_thresholds_are_documented() -> None:
    """Each rule's thresholds are named constants, and docs/diagnosis.md lists every one of them."""
    from pathlib import Path

    readme = (Path(__file__).parent.parent / "docs" / "diagnosis.md").read_text()
    modules = (rules, failures, measured, tokens, baselines, connections, pool, dns,
               rate_limits, seen, advice, grouping)  # fmt: skip
    names = [
        n
        for module in modules
        for n in vars(module)
        if n.isupper()
        and isinstance(getattr(module, n), int | float)
        and n not in ("DNS", "QUEUE", "WAIT")
    ]
    assert len(names) >= 40
    missing = [n for n in names if f"`{n}`" not in readme]
    assert not missing, missing
    assert all(rule.__doc__ for rule in rules.RULES)
    assert set(failures.FAILURE_RULES) >= {"rate-limits"}  # ranked with the failures
    every = {f.__name__.replace("_", "-") for f in rules.RULES}
    assert {rule for yielding in tokens.SUPERSEDED.values() for rule in yielding} <= every
    assert all(f"`{rule}`" in readme for rule in every)


async def test_refused_calls_that_were_not_retried(telemetry: Telemetry, server: LLMServer) -> None:
    """429s with no retry: the finding says those calls failed, and claims no saving of the
    few ms a refusal takes."""
    async with aiohttp.ClientSession() as session:
        for status in (429, 200, 429, 200):
            async with session.post(server.url(status=status), json={}) as response:
                await response.read()
    found = finding(diagnose(telemetry.spans()), "rate-limits")
    assert "2 of 4 attempts were rate limited (429) and none was retried" in found.cause
    assert found.saving is None
    # The evidence is the share of the requests refused, not the few ms of "lost" time
    # (which read "0% of the time" on a finding where nothing was retried).
    assert (found.evidence.phase, found.evidence.share_of) == ("429 responses", "the requests")
    assert found.evidence.share == 0.5
    assert "50% of the requests" in found.evidence.text()


async def test_the_servers_time_of_refusals_is_not_the_models(
    telemetry: Telemetry, server: LLMServer
) -> None:
    """Only answered requests say how long the model took: 429s are left out."""
    await run(3, server.url(wait=0.6))
    async with aiohttp.ClientSession() as session:
        for _ in range(4):
            async with session.post(server.url(status=429), json={}) as response:
                await response.read()
    found = finding(diagnose(telemetry.spans()), "server-time")
    assert found.evidence.count == 3 and found.evidence.p50 >= 0.6


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0005, "500 µs"),
        (0.0009996, "1.0 ms"),
        (0.0123, "12.3 ms"),
        (0.09996, "100 ms"),
        (0.5, "500 ms"),
        (0.9996, "1.00 s"),
        (1.234, "1.23 s"),
        (150.0, "150 s"),
    ],
)
def test_durations_read_as_people_write_them(seconds: float, text: str) -> None:
    """A number and its unit, joined by a no-break space; never "1000 ms" for a second."""
    assert duration(seconds) == text


def _streamed(queued: float, stall: float) -> Attempt:
    """A stream whose control events come at once, held ``queued`` (s) before its first token,
    then 20 tokens 10 ms apart but for one pause of ``stall`` (the longest gap, from the
    first token)."""
    tokens = 0.19 + stall
    receive = queued + tokens
    phases = (Phase("send", 0.0, 0.001), Phase("wait", 0.001, 0.05),
              Phase("receive", 0.051, receive))  # fmt: skip
    return Attempt(0, 0.051 + receive, phases, host="h", method="POST", status=200,
                   time_to_first_chunk=0.051, time_to_first_token=0.051 + queued,
                   stream_events=23, stream_max_gap=stall)  # fmt: skip


def test_a_stall_is_measured_against_the_streams_pace_after_its_first_token() -> None:
    """A stream held 8 s in the provider's queue before its first token, its tokens then
    stopped 1.2 s: the stall is one, against the 10 ms the tokens came at; the wait before
    the first token does not make the stream's pace seem slow."""
    found = diagnose([Call("c", 0, 10.0, [_streamed(8.0, 1.2)])])
    assert "stream-stall" in rules_found(found)
    assert "stream-stall" not in rules_found(diagnose([Call("c", 0, 10.0, [_streamed(8.0, 0.01)])]))


# -- evidence, hand-overs, the loop's own stall ------------------------------------------------


def _attempt(start: float, queue: float, held: float, lag: float | None = None) -> Attempt:
    """An attempt that starts at ``start`` (s), waits ``queue`` for a connection and holds it
    ``held``; ``lag``: the loop's stall in its queue phase."""
    phases = [Phase("send", queue, 0.001), Phase("wait", queue + 0.001, held - 0.002),
              Phase("receive", queue + held - 0.001, 0.001)]  # fmt: skip
    if queue:
        phases.insert(0, Phase("queue", 0.0, queue, lag))
    return Attempt(int(start * 1e9), queue + held, tuple(phases), host="h", method="POST",
                   status=200, client="aiohttp")  # fmt: skip


def test_a_connection_handed_over_is_no_larger_pool() -> None:
    """Eight at once through two connections, 0.1 s each: each waiting request takes its
    connection 2 ms before the request it follows has ended its span (a loaded machine ends a
    span late). The pool served two at a time, not three."""
    attempts = [_attempt(0.0, 0.0, 0.1), _attempt(0.0, 0.0, 0.1)]
    for round_ in range(1, 4):
        for _ in range(2):
            attempts.append(_attempt(0.0, round_ * 0.1 - 0.002, 0.1))
    found = finding(diagnose([Call("c", 0, 0.4, attempts)]), "pool-queue")
    assert "8 were in flight at once on a pool that served 2 at a time" in found.cause
    assert "from 2 to 8" in found.fix
    assert "aiohttp.TCPConnector(limit=8, limit_per_host=8)" in found.fix
    assert "httpx" not in found.fix and "HTTPAdapter" not in found.fix  # only the client in use


def test_a_long_burst_is_counted_in_flight_whatever_its_waves() -> None:
    """Sixty at once through five connections, 0.1 s each: twelve waves, so that most requests
    spend far longer queued than served. All sixty were in flight at once for a whole service
    time: the level a hand-over never reaches, however long the queue made the median request
    (a burst of 30 on a loaded machine was told "1 were in flight")."""
    attempts = [_attempt(0.0, wave * 0.1, 0.1) for wave in range(12) for _ in range(5)]
    found = finding(diagnose([Call("c", 0, 1.2, attempts)]), "pool-queue")
    assert "60 were in flight at once on a pool that served 5 at a time" in found.cause


def test_a_queue_that_was_the_loop_s_stall_is_not_the_pool_s() -> None:
    """The same queue, all of it the program's own stall (per-phase lag): no pool finding."""
    attempts = [_attempt(0.0, 0.0, 0.1), _attempt(0.0, 0.0, 0.1)]
    attempts += [_attempt(0.0, 0.3, 0.1, lag=0.3) for _ in range(6)]
    assert "pool-queue" not in rules_found(diagnose([Call("c", 0, 0.4, attempts)]))


def test_an_http2_queue_counts_without_the_loop_s_stall_in_it() -> None:
    """Six HTTP/2 requests at once on a connection that runs two: four waited for a stream (two
    0.3 s, two 0.5 s), 0.1 s of each wait the program's own stall. The stall is
    event-loop-lag's; http2-stream-limit claims the rest of the queue, as pool-queue does."""
    attempts = []
    for i in range(6):
        queued = i // 2 * 0.2 + (0.1 if i >= 2 else 0.0)
        attempt = _attempt(0.0, queued, 0.2, lag=0.1 if i >= 2 else None)
        attempt.protocol = "2"
        attempt.event_loop_lag = 0.1 if i >= 2 else 0.0
        attempts.append(attempt)
    findings = diagnose([Call("c", 0, 0.8, attempts)])
    assert {"http2-stream-limit", "event-loop-lag"} <= set(rules_found(findings))
    streams = finding(findings, "http2-stream-limit")
    assert streams.saving is not None
    assert streams.saving.p50 == pytest.approx(0.3) and streams.saving.p95 == pytest.approx(0.4)


def test_phase_spans_lag_is_read_and_taken_off() -> None:
    """``llm_latency.event_loop.lag`` on a phase span: ``Phase.lag``, and ``net`` without it;
    a phase span without it has no lag (unknown), not 0."""
    request = SpanRecord("1" * 32, "2" * 16, None, "POST", "CLIENT", 0, 500_000_000,
                         {"url.full": "http://h/", "llm_latency.event_loop.lag": 0.3,
                          "llm_latency.client": "httpx"}, "llm_latency")  # fmt: skip
    dns = SpanRecord("1" * 32, "3" * 16, "2" * 16, "http.dns", "INTERNAL", 0, 400_000_000,
                     {"llm_latency.phase": "dns", "llm_latency.event_loop.lag": 0.3},
                     "llm_latency")  # fmt: skip
    wait = SpanRecord("1" * 32, "4" * 16, "2" * 16, "http.wait", "INTERNAL", 400_000_000,
                      500_000_000, {"llm_latency.phase": "wait"}, "llm_latency")  # fmt: skip
    (attempt,) = calls_from_spans([request, dns, wait])[0].attempts
    assert attempt.phases[0].lag == 0.3 and attempt.phases[1].lag is None
    assert attempt.net("dns") == pytest.approx(0.1) and attempt.net("wait") == pytest.approx(0.1)
    assert attempt.client == "httpx"


# -- tokens ----------------------------------------------------------------------------------

URL = "http://h/v1/chat/completions"


def _answer(
    start: float,
    *,
    ttft: float | None = None,
    tpot: float = 0.01,
    took: float = 0.2,
    prompt: int = 20,
    output: int = 20,
    cached: int | None = 0,
    **extra: Any,
) -> Attempt:
    """A chat completion answered at ``start`` (s): streamed when ``ttft`` is given (its first
    token then, one more every ``tpot``), else read whole after ``took``, all of it the
    server's time (the facts the emitter puts on such spans)."""
    facts: dict[str, Any]
    if ttft is not None:
        took = ttft + (output - 1) * tpot + 0.001
        wait = Phase("wait", 0.001, ttft - 0.001)
        facts = {"time_to_first_chunk": ttft, "time_to_first_token": ttft,
                 "time_per_output_token": tpot, "stream_events": output}  # fmt: skip
    else:
        wait = Phase("wait", 0.001, took - 0.002)
        facts = {"server_time_per_output_token_max": (took - 0.002) / output}
    phases = (Phase("send", 0.0, 0.001), wait, Phase("receive", wait.start + wait.duration,
              took - wait.start - wait.duration))  # fmt: skip
    return Attempt(int(start * 1e9), took, phases, url=URL, host="h", method="POST",
                   status=200, client="aiohttp", model="m", input_tokens=prompt,
                   output_tokens=output, cached_tokens=cached,
                   server_processing=wait.duration - 0.001, **{**facts, **extra})  # fmt: skip


def _one_by_one(attempts: list[Attempt], gap: float = 0.01) -> list[Attempt]:
    """The attempts moved to run one after another, ``gap`` apart."""
    at = 0
    for attempt in attempts:
        attempt.start_ns = at
        at += int((attempt.duration + gap) * 1e9)
    return attempts


def test_long_answers_not_streamed_are_the_output_s_length() -> None:
    """600 tokens read whole in 1.2 s: the answer's length, at the server's bound per token;
    server-time and not-streamed describe the same seconds and yield to it."""
    attempts = [_answer(0, took=1.2, output=600) for _ in range(3)]
    assert rules.server_time([Call("c", 0, 1.2, attempts)]) is not None
    findings = diagnose(attempts)
    assert rules_found(findings) == ["long-answer"]
    found = finding(findings, "long-answer")
    assert "600 output tokens" in found.cause and "upper bound" in found.cause
    assert "max_tokens" in found.fix and "max_completion_tokens" in found.fix
    assert "stream=True" in found.fix
    assert found.saving is not None and found.saving.requests == 3
    assert found.saving.p50 == pytest.approx(300 * (1.2 - 0.002) / 600)


def test_long_answers_streamed() -> None:
    attempts = [_answer(0, ttft=0.1, tpot=0.005, output=400) for _ in range(2)]
    found = finding(diagnose(attempts), "long-answer")
    assert "5.0 ms per token (200 tokens/s)" in found.cause
    assert "stream=True" not in found.fix  # already streamed
    assert found.saving is not None and found.saving.p50 == pytest.approx(200 * 0.005)


@pytest.mark.parametrize(
    "attempts",
    [
        [_answer(0, ttft=0.1, tpot=0.02, output=200) for _ in range(3)],  # not that long
        [_answer(0, ttft=0.1, tpot=0.001, output=600) for _ in range(3)],  # quickly made
        [_answer(0, ttft=0.1, tpot=0.005, output=600)],  # one answer is no evidence
        [_answer(0, ttft=3.0, tpot=0.004, output=400) for _ in range(3)],  # the wait is most
    ],
    ids=["200 tokens", "0.6 s of tokens", "one", "mostly waiting"],
)
def test_answers_that_are_not_long(attempts: list[Attempt]) -> None:
    assert "long-answer" not in rules_found(diagnose(attempts))


def _chat_growing(cached: int | None = 0, per_token: float = 0.0004) -> list[Attempt]:
    """Five turns of a chat resending its history: 500 to 2500 prompt tokens."""
    sizes = [500 * n for n in range(1, 6)]
    return [_answer(0, ttft=0.05 + per_token * size, prompt=size, cached=cached, output=10)
            for size in sizes]  # fmt: skip


@pytest.mark.parametrize(
    ("cached", "said", "long"),
    [
        (0, "none of the prompt tokens came from the cache", 4),
        (250, "came from the cache", 3),  # 1000 tokens, 250 cached: 750 to read
        (None, "did not say how many prompt tokens came from its cache", 4),
    ],
)
def test_long_prompts(cached: int | None, said: str, long: int) -> None:
    found = finding(diagnose(_chat_growing(cached)), "long-prompt")
    assert found.evidence.count == long  # the prompts of 1000 tokens or more to read
    assert "the time to first token grows with the prompt" in found.cause
    assert "cache_control" in found.fix and "1024 tokens" in found.fix and said in found.fix
    assert "server-time" not in rules_found(diagnose(_chat_growing(cached)))
    assert found.saving is not None
    if cached == 0:  # 0.4 ms per token: half of a 1750-token prompt's (the p50 of the four)
        assert found.saving.p50 == pytest.approx(0.0004 * 1750 / 2, rel=0.01)


def test_a_prompt_the_provider_times_itself() -> None:
    """Ollama says its prefill time: no fit is needed."""
    attempts = [_answer(0, took=1.5, prompt=3000, server_prefill=1.2) for _ in range(2)]
    assert rules_found(diagnose(attempts))[0] == "long-prompt"


@pytest.mark.parametrize(
    "attempts",
    [
        [_answer(0, ttft=1.0, prompt=3000, output=10) for _ in range(5)],  # one size: no fit
        _chat_growing(per_token=0.00005),  # 50 µs a token: the prompt is no large part
        _chat_growing()[2:],  # three calls: no baseline to fit
    ],
    ids=["same size", "cheap tokens", "three calls"],
)
def test_prompts_that_do_not_explain_the_wait(attempts: list[Attempt]) -> None:
    assert "long-prompt" not in rules_found(diagnose(attempts))


def _queued(late: float, late_tpot: float = 0.005, n: int = 4) -> list[Attempt]:
    """``n`` calls that got their first token after 0.1 s, then three after ``late``."""
    usual = [_answer(0, ttft=0.1, tpot=0.005, prompt=300) for _ in range(n)]
    return usual + [_answer(0, ttft=late, tpot=late_tpot, prompt=300) for _ in range(3)]


def test_provider_queue() -> None:
    findings = diagnose(_queued(1.0))
    assert rules_found(findings)[0] == "provider-queue"
    found = finding(findings, "provider-queue")
    assert "3 of 7 requests to h (m) got their first token 1.00 s after sending" in found.cause
    assert "100 ms usual for prompts of that size" in found.cause
    assert "llm-latency watch" in found.fix and "provisioned" in found.fix
    assert found.saving is not None and found.saving.p50 == pytest.approx(0.9, abs=0.01)
    assert "long-prompt" not in rules_found(findings)


def test_a_queue_the_provider_reports() -> None:
    """A queue time in the response: no baseline is needed."""
    attempts = [_answer(0, ttft=0.9, server_queue=0.8) for _ in range(2)]
    found = finding(diagnose(attempts), "provider-queue")
    assert "the provider reported 800 ms of queue time at p50" in found.cause


def _behind_the_pool() -> list[Attempt]:
    """:func:`_queued`, the late ones late because they waited 0.9 s for a pooled connection."""
    attempts = _queued(1.0)
    for attempt in attempts[4:]:
        attempt.phases = (Phase("queue", 0.0, 0.9), *attempt.phases)
    return attempts


@pytest.mark.parametrize(
    "attempts",
    [
        _queued(1.0, n=0),  # three calls, all late: no baseline
        _queued(0.25),  # 2.5 times the usual: within its spread
        _queued(1.0, late_tpot=0.05),  # the whole answer slow: slow-generation's
        _chat_growing(),  # late because long: long-prompt's
        _behind_the_pool(),  # late because of this side's pool
    ],
    ids=["no baseline", "not far", "slow decode", "long prompts", "the pool's"],
)
def test_late_first_tokens_that_are_no_queue(attempts: list[Attempt]) -> None:
    assert "provider-queue" not in rules_found(diagnose(attempts))


def test_slow_generation() -> None:
    attempts = [_answer(0, ttft=0.1, tpot=0.01, output=50) for _ in range(4)]
    attempts += [_answer(0, ttft=0.1, tpot=0.06, output=50) for _ in range(3)]
    findings = diagnose(attempts)
    assert rules_found(findings) == ["slow-generation"]
    found = finding(findings, "slow-generation")
    assert "60.0 ms per output token at p50 (17 tokens/s)" in found.cause
    assert "usual 10.0 ms (100 tokens/s" in found.cause
    assert found.saving is not None and found.saving.p50 == pytest.approx(0.05 * 49)


def test_long_answers_that_came_slowly_leave_the_slowness_to_slow_generation() -> None:
    """Long answers, three of seven at six times the usual pace: both findings, and never the
    same seconds. A slow answer's decode (599 tokens at 60 ms) is slow-generation's beyond the
    usual 10 ms a token, and long-answer's half of it at the usual pace: together no more than
    the decode (before, long-answer counted half of it at the slow pace: 18 s beside the 30 s of
    slowness slow-generation claimed, on 36 s of decode)."""
    attempts = [_answer(0, ttft=0.1, tpot=0.01, output=600) for _ in range(4)]
    attempts += [_answer(0, ttft=0.1, tpot=0.06, output=600) for _ in range(3)]
    findings = diagnose(attempts)
    assert rules_found(findings) == ["slow-generation", "long-answer"]
    slow, long = finding(findings, "slow-generation"), finding(findings, "long-answer")
    assert slow.saving is not None and long.saving is not None
    assert slow.saving.p50 == pytest.approx(0.05 * 599)
    # every answer saves half its tokens at the usual pace, the slow ones included
    assert long.saving.p50 == pytest.approx(300 * 0.01)
    assert long.saving.p95 == pytest.approx(300 * 0.01)
    assert slow.saving.p95 + long.saving.p95 <= 599 * 0.06
    assert "the 3 that came slowly save theirs at the endpoint's usual 10.0 ms" in long.fix


def test_a_pause_mid_stream_is_the_stall_s_not_a_slow_pace() -> None:
    """Three of nine streams paused 5 s between two tokens, their tokens otherwise at the usual
    10 ms: the pause is stream-stall's, and the pace it leaves is the usual one. Before,
    the pause made their time per output token 35 ms and slow-generation claimed the same 5 s
    ("the provider generated slowly"), ranked first."""
    attempts = [_answer(0, ttft=0.1, tpot=0.01, output=200) for _ in range(6)]
    paused = [_answer(0, ttft=0.1, tpot=0.01 + 5.0 / 199, output=200) for _ in range(3)]
    for attempt in paused:
        attempt.stream_max_gap = 5.0
    findings = diagnose(attempts + paused)
    assert rules_found(findings) == ["stream-stall"]
    stall = finding(findings, "stream-stall")
    mean = (paused[0].duration - 0.1) / 200  # the stream's mean gap after its first token
    assert stall.saving is not None and stall.saving.p50 == pytest.approx(5.0 - mean)
    # a pace that is slow without a pause is still slow-generation's
    slow = [_answer(0, ttft=0.1, tpot=0.01 + 5.0 / 199, output=200) for _ in range(3)]
    assert "slow-generation" in rules_found(diagnose(attempts + slow))


def test_long_answers_slower_than_usual_on_too_few_count_at_their_pace() -> None:
    """One slow answer among long ones is no slow-generation finding: long-answer keeps its
    whole decode, at its own pace."""
    attempts = [_answer(0, ttft=0.1, tpot=0.01, output=600) for _ in range(6)]
    attempts.append(_answer(0, ttft=0.1, tpot=0.06, output=600))
    findings = diagnose(attempts)
    assert "slow-generation" not in rules_found(findings)
    long = finding(findings, "long-answer")
    assert long.saving is not None and long.saving.p95 > 300 * 0.01
    assert "came slowly" not in long.fix


@pytest.mark.parametrize(
    "attempts",
    [
        [_answer(0, ttft=0.1, tpot=0.06, output=50) for _ in range(3)],  # no baseline
        [_answer(0, ttft=0.1, tpot=0.06, output=50) for _ in range(8)],  # the usual pace
        [_answer(0, ttft=0.1, tpot=t, output=5) for t in (0.01,) * 4 + (0.1,) * 3],  # 5 tokens
        [_answer(0, took=2.0, output=50) for _ in range(8)],  # only bounds, not streamed
    ],
    ids=["no baseline", "uniform", "short answers", "bounds"],
)
def test_generation_that_is_not_slow(attempts: list[Attempt]) -> None:
    assert "slow-generation" not in rules_found(diagnose(attempts))


def _small_prompts(n: int = 10, **kw: Any) -> list[Attempt]:
    """``n`` small prompts read whole: 120 ms each, and 5 ms per output token."""
    return [_answer(0, took=0.12 + 0.005 * (2 + i % 7), prompt=10 + 3 * i, output=2 + i % 7, **kw)
            for i in range(n)]  # fmt: skip


def test_small_prompts_one_by_one() -> None:
    findings = diagnose(_one_by_one(_small_prompts()))
    assert rules_found(findings) == ["small-prompts-one-by-one"]
    found = finding(findings, "small-prompts-one-by-one")
    assert "10 small prompts went one after another" in found.cause
    assert "1 request of about" in found.fix and "max_tokens to at least 80" in found.fix
    assert "concurrently" in found.fix
    assert found.saving is not None and found.saving.requests == 9
    assert found.saving.p50 == pytest.approx(0.12, abs=0.005)  # the fixed cost, not the tokens


def test_small_streamed_prompts_one_by_one() -> None:
    attempts = [_answer(0, ttft=0.2, tpot=0.005, prompt=10 + i, output=5) for i in range(8)]
    found = finding(diagnose(_one_by_one(attempts)), "small-prompts-one-by-one")
    assert found.saving is not None and found.saving.p50 == pytest.approx(0.2)


def test_small_prompts_on_new_connections_leave_the_set_up_to_new_connections() -> None:
    """Ten small prompts one after another, each on a new connection (0.2 s of DNS, TCP and
    TLS; a script that posts without a session): both findings, and never the same seconds.
    Merging removes the set-up too, but new-connections' fix removes it without merging: the
    merge saves the 0.3 s to the first token that is the provider's and the round trip's.
    Before, it counted the whole 0.5 s, the set-up new-connections claimed included."""
    attempts = []
    for i in range(10):
        attempt = _answer(0, ttft=0.3, tpot=0.01, prompt=100 + 10 * i, output=20)
        later = tuple(Phase(p.name, p.start + 0.2, p.duration, p.lag) for p in attempt.phases)
        set_up = (Phase("dns", 0.0, 0.05), Phase("connect", 0.05, 0.05), Phase("tls", 0.1, 0.1))
        attempt.phases = set_up + later
        attempt.duration += 0.2
        attempt.time_to_first_token = attempt.time_to_first_chunk = 0.5
        attempt.reused = False
        attempts.append(attempt)
    findings = diagnose(_one_by_one(attempts))
    assert {"small-prompts-one-by-one", "new-connections"} <= set(rules_found(findings))
    merged = finding(findings, "small-prompts-one-by-one")
    connections = finding(findings, "new-connections")
    assert "500 ms of each request" in merged.cause  # the whole fixed cost, as seen
    assert merged.saving is not None and connections.saving is not None
    assert merged.saving.p50 == pytest.approx(0.3)
    assert merged.saving.p50 + connections.saving.p50 == pytest.approx(0.5)
    assert "leaves out the connections' set-up" in merged.fix


@pytest.mark.parametrize(
    "attempts",
    [
        _one_by_one(_small_prompts(7)),  # too few
        _small_prompts(),  # all at once
        _one_by_one(_small_prompts(), gap=1.0),  # far apart: one per user action
        _one_by_one([_answer(0, took=0.15, prompt=12, output=5) for _ in range(10)]),  # a probe
        _one_by_one([_answer(0, took=0.15, prompt=600 + i, output=5) for i in range(10)]),
        _one_by_one(
            [_answer(0, took=0.1 + 0.05 * i, prompt=10 + i, output=1 + 10 * i) for i in range(10)]
        ),
    ],
    ids=["7", "concurrent", "far apart", "one request repeated", "large prompts", "decode"],
)
def test_prompts_that_are_no_batch(attempts: list[Attempt]) -> None:
    assert "small-prompts-one-by-one" not in rules_found(diagnose(attempts))


def test_server_time_names_the_tokens() -> None:
    """No token rule applies (0.8 s for 50 tokens, no baseline to compare with): server-time
    stays, with the tokens it was for."""
    attempts = [_answer(0, took=0.8, prompt=120, output=50) for _ in range(3)]
    found = finding(diagnose(attempts), "server-time")
    assert "(prompts of 120 tokens, answers of 50 at p50)" in found.cause


def test_baselines_are_per_endpoint() -> None:
    """The same calls split over two models: neither has a baseline of its own."""
    attempts = _queued(1.0, n=2)
    for attempt in attempts[1::2]:
        attempt.model = "other"
    assert baselines.first_token_model(attempts) is not None
    assert all(
        baselines.first_token_model(group) is None
        for group in baselines.by_endpoint(attempts).values()
    )
    assert "provider-queue" not in rules_found(diagnose(attempts))
