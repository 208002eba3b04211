"""Advice a user can apply by rote, and the saving it then brings (issue 37): one test per way
the findings failed a user who applied their fix as written.

- Two findings claimed the same handshakes, and the one ranked first (``slow-connect``) had a
  fix that named no API; the fix that removes them (one client for the program's life) must
  come first and name the client's own API.
- ``slow-dns`` told a program whose DNS cache was on to keep it on: a fix must not repeat what
  the program already does.
- A program's own retry loop was not seen as retries, so its waits beyond ``retry-after`` got
  no saving.
- The pool's fix named one of aiohttp's two limits, ignored the set-up of the connections it
  adds, and summed per-request waits into a saving no clock shows.

Real programs against loopback peers (tests/scenarios/applied_programs.py), and records where
a case needs times no loopback run gives (a lookup 15 s after the last).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import httpx
import pytest
import requests

from llm_latency import diagnose
from llm_latency.diagnosis import Attempt, Call, Finding, SpanRecord, calls_from_spans
from llm_latency.diagnosis.records import Phase
from tests.scenarios.applied_programs import (
    AT_ONCE,
    distant,
    dns_burst,
    pooled,
    rate_limited,
    run,
)
from tests.scenarios.client_programs import (
    Config,
    Target,
    aiohttp_burst,
    aiohttp_calls,
    httpx_calls,
    requests_calls,
)
from tests.scenarios.programs import BODY


def found(findings: list[Finding], rule: str) -> Finding:
    (finding,) = [f for f in findings if f.rule == rule]
    return finding


# -- the fix that removes the seconds ranks first, and names the client's API --------------------


@pytest.mark.parametrize(
    ("program", "sync", "api"),
    [
        pytest.param(requests_calls, True, "requests.Session()", id="requests.post"),
        pytest.param(httpx_calls, True, "httpx.Client()", id="httpx.Client"),
        pytest.param(aiohttp_calls, False, "aiohttp.ClientSession()", id="aiohttp.ClientSession"),
    ],
)
def test_the_fix_that_removes_the_handshakes_ranks_first(
    program: Callable[[Config, Target, int], object], sync: bool, api: str
) -> None:
    """A client per call to a distant HTTPS server: ``slow-connect`` counts every handshake,
    ``new-connections`` all but the one the program needs; only the second one's fix removes
    them, so it ranks first, names the client's API, and ``slow-connect`` keeps only the
    handshake no reuse removes."""
    findings = diagnose(run(distant(program, sync), Config(reuse=False)))
    assert findings[0].rule == "new-connections", [f.rule for f in findings]
    assert f"one {api} for the program's life" in findings[0].fix
    assert findings[0].change is not None and findings[0].change.call() == api
    slow = found(findings, "slow-connect")
    assert slow.evidence.count == 6  # the cause still counts every handshake...
    assert slow.saving is not None and slow.saving.requests == 1  # ... the saving one
    assert "new-connections" in slow.fix and "keep connections alive" not in slow.fix


# -- a fix that is already in place is not the fix -----------------------------------------------


def test_a_burst_of_lookups_is_not_told_to_keep_the_cache_on() -> None:
    """Twelve connections at once to one name, aiohttp's DNS cache on: they all wait for the
    one answer in flight. The cache is no fix for that, and nothing on the client's side
    removes a first lookup: what applies instead, and no saving."""
    finding = found(diagnose(run(dns_burst, Config(use_dns_cache=True))), "slow-dns")
    assert "DNS cache on" not in finding.fix
    assert "resolve each name once before the requests start" in finding.fix
    assert "nearer or local caching resolver" in finding.fix
    assert f"{AT_ONCE - 1} began while a lookup of the same name was in flight" in finding.cause
    assert finding.saving is None and finding.change is None


async def _aiohttp_closing(target: Target, n: int, **closing: Any) -> None:
    """``n`` calls one after another through one ``aiohttp.ClientSession`` for the program's
    life, its DNS cache off, whose connections close after each request: ``force_close=True``
    on the connector, or ``headers``."""
    headers = closing.pop("headers", None)
    connector = aiohttp.TCPConnector(use_dns_cache=False, ssl=target.context(), **closing)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        for _ in range(n):
            async with session.post(target.url, json=BODY) as response:
                await response.read()


def _httpx_closing(target: Target, n: int, **closing: Any) -> None:
    """``n`` calls one after another through one ``httpx.Client``, with the ``headers`` or
    ``limits`` that close its connections after each request."""
    with httpx.Client(verify=target.context(), timeout=30, **closing) as client:
        for _ in range(n):
            client.post(target.url, json=BODY)


def _requests_closing(target: Target, n: int, **closing: Any) -> None:
    """``n`` calls one after another through one ``requests.Session`` with the ``headers``."""
    with requests.Session() as session:
        session.headers.update(closing["headers"])
        for _ in range(n):
            session.post(target.url, json=BODY, verify=target.ca_file or True, timeout=30).close()


CLOSE = {"headers": {"Connection": "close"}}


@pytest.mark.parametrize(
    ("send", "closing", "setting", "change"),
    [
        pytest.param(_aiohttp_closing, {"force_close": True}, "force_close=True",
                     "aiohttp.TCPConnector(force_close=False)", id="aiohttp force_close"),
        pytest.param(_aiohttp_closing, CLOSE, "Connection: close", None,
                     id="aiohttp Connection: close"),
        pytest.param(_httpx_closing, CLOSE, "Connection: close", None,
                     id="httpx Connection: close"),
        pytest.param(_httpx_closing, {"limits": httpx.Limits(max_keepalive_connections=0)},
                     "max_keepalive_connections=0",
                     "httpx.Limits(max_keepalive_connections=1)",
                     id="httpx max_keepalive_connections=0"),
        pytest.param(_requests_closing, CLOSE, "Connection: close", None,
                     id="requests Connection: close"),
    ],
)  # fmt: skip
def test_a_reused_client_that_closes_its_connections_is_told_the_setting(
    send: Callable[..., object], closing: dict[str, Any], setting: str, change: str | None
) -> None:
    """One client for the program's life whose connections close after each request (the usual
    workaround for "Server disconnected"): every request opens a connection again. Reusing the
    client is what the program already does; the fix names the setting that closes them."""

    def program(config: Config, target: Target, n: int) -> object:
        return send(target, n, **closing)

    findings = diagnose(run(distant(program, sync=send is not _aiohttp_closing), Config()))
    top = findings[0]
    assert top.rule == "new-connections", [f.rule for f in findings]
    assert setting in top.cause and setting in top.fix, top
    assert "for the program's life" not in top.fix
    assert (None if top.change is None else top.change.call()) == change


def _looked_up(start: float, dns: float, client: str) -> Attempt:
    """An attempt at ``start`` (s) that resolved the name for ``dns`` s, then answered in
    50 ms on a new connection."""
    phases = (Phase("dns", 0.0, dns), Phase("connect", dns, 0.001),
              Phase("wait", dns + 0.001, 0.05))  # fmt: skip
    return Attempt(int(start * 1e9), dns + 0.051, phases, url="http://llm.test/v1",
                   host="llm.test", method="POST", status=200, reused=False, client=client)  # fmt: skip


def _pooled(start: float, client: str) -> Attempt:
    return Attempt(int(start * 1e9), 0.05, (Phase("wait", 0.0, 0.05),), url="http://llm.test/v1",
                   host="llm.test", method="POST", status=200, reused=True, client=client)  # fmt: skip


def _one_by_one(first: float, then: float, client: str) -> list[Call]:
    """A lookup, nine requests on the pooled connection, and after ``then`` s a new connection
    that looks the name up again (its idle connection was closed)."""
    attempts = [_looked_up(0.0, first, client)]
    attempts += [_pooled(first + 0.06 * (i + 1), client) for i in range(9)]
    attempts.append(_looked_up(then, first, client))
    return [Call("POST", a.start_ns, a.duration, [a]) for a in attempts]


def test_a_lookup_repeated_after_the_cache_expired_gets_a_longer_ttl() -> None:
    """aiohttp's cache keeps an answer ``ttl_dns_cache`` s (10 by default): a lookup repeated
    15 s after the last answer calls for a longer one, with its value (twice that)."""
    finding = found(diagnose(_one_by_one(0.1, 15.0, "aiohttp")), "slow-dns")
    assert "aiohttp.TCPConnector(use_dns_cache=True, ttl_dns_cache=30)" in finding.fix
    assert finding.change is not None and finding.change.parameters == {
        "use_dns_cache": True, "ttl_dns_cache": 30}  # fmt: skip
    assert finding.saving is not None and finding.saving.p50 == pytest.approx(0.1)


def test_a_client_without_a_dns_cache_is_not_told_to_keep_its_own() -> None:
    finding = found(diagnose(_one_by_one(0.1, 15.0, "httpx")), "slow-dns")
    assert "local caching resolver" in finding.fix and "ttl_dns_cache" not in finding.fix
    assert "httpx keeps no DNS cache of its own" in finding.fix
    assert finding.change is None


# -- a program's own retry loop ------------------------------------------------------------------


def test_a_program_s_own_retry_loop_is_retries() -> None:
    """Four calls, each in a span of the program's own; every second request is refused with
    retry-after-ms 50, and the program's loop sleeps 250 ms whatever it asked: the refused
    calls succeeded on their retry, and honouring retry-after saves about 200 ms each."""
    calls = run(rate_limited, Config(retry="own", pause=0.25))
    assert [len(call.attempts) for call in calls] == [1, 2, 2, 2]
    waits = [b for call in calls for b in call.backoffs]
    assert len(waits) == 3 and all(b.inferred and b.retry_after == 0.05 for b in waits)
    finding = found(diagnose(calls), "rate-limits")
    assert "none was retried" not in finding.cause
    assert "3 were retries by the program's own loop" in finding.cause
    assert finding.change is not None and finding.change.call() == "llm_latency.retry(attempts=2)"
    assert finding.saving is not None and finding.saving.kind == "wall"
    beyond = sum(b.duration - 0.05 for b in waits)  # each at least 200 ms, as slept
    assert finding.saving.seen == pytest.approx(beyond)
    assert 3 * 0.2 <= beyond < 3 * 0.2 * 1.5


def _attempt(start: float, status: int, url: str = "http://h/v1", span: str = "2") -> SpanRecord:
    return SpanRecord("1" * 32, span * 16, "f" * 16, "POST", "CLIENT", int(start * 1e9),
                      int((start + 0.01) * 1e9),
                      {"url.full": url, "http.request.method": "POST",
                       "http.response.status_code": status,
                       "http.response.header.retry-after-ms": ("40",)},
                      "llm_latency")  # fmt: skip


@pytest.mark.parametrize(
    ("second", "calls"),
    [
        pytest.param(_attempt(0.1, 200, span="3"), [2], id="the same request again: a retry"),
        pytest.param(_attempt(0.1, 200, "http://h/v2", "3"), [1, 1], id="another request"),
        pytest.param(_attempt(0.012, 200, span="3"), [1, 1], id="at once: a new request"),
    ],
)
def test_own_retries_are_the_same_request_again_after_a_wait(
    second: SpanRecord, calls: list[int]
) -> None:
    parent = SpanRecord("1" * 32, "f" * 16, None, "ask", "INTERNAL", 0, 200_000_000, {}, "app")
    grouped = calls_from_spans([parent, _attempt(0.0, 429), second])
    assert [len(call.attempts) for call in grouped] == calls
    if calls == [2]:
        (wait,) = grouped[0].backoffs
        assert wait.inferred and wait.reason == "429" and wait.retry_after == 0.04
        assert wait.duration == pytest.approx(0.09)


# -- the pool: both limits, the set-up it adds, the wall time ------------------------------------


def test_the_pool_fix_names_both_limits_and_the_batch_s_wall_time() -> None:
    """Twelve at once through ``TCPConnector(limit=8, limit_per_host=3)``: raising
    limit_per_host alone leaves limit capping the pool at 8; the fix sets both, and its saving
    is the batch's wall time, not the sum of the requests' waits."""
    calls = run(pooled(aiohttp_burst, sync=False), Config(limit=8, limit_per_host=3))
    finding = found(diagnose(calls), "pool-queue")
    assert "aiohttp.TCPConnector(limit=12, limit_per_host=12)" in finding.fix
    assert finding.saving is not None and finding.saving.kind == "wall"
    assert "of the batch's wall time" in finding.saving.text()
    wall = (max(c.start_ns + c.duration * 1e9 for c in calls) - calls[0].start_ns) / 1e9
    assert finding.saving.seen is not None and finding.saving.seen < wall
    assert finding.saving.total > 2 * wall  # what "in all" summed, and no clock shows


def _queued(held: float, setup: float) -> list[Call]:
    """Eight at once through two connections, each set up in ``setup`` s and held ``held``."""
    attempts = []
    for number in range(8):
        queue = (number // 2) * held + (setup if number >= 2 else 0.0)
        phases = [Phase("queue", 0.0, queue)] if queue else []
        own = setup if number < 2 else 0.0
        if own:
            phases.append(Phase("connect", 0.0, own))
        phases.append(Phase("wait", queue + own, held))
        attempts.append(Attempt(0, queue + own + held, tuple(phases), url="https://h/v1",
                                host="h", method="POST", status=200, reused=not own,
                                client="aiohttp"))  # fmt: skip
    return [Call("POST", 0, a.duration, [a]) for a in attempts]


def test_the_pool_s_saving_pays_for_the_connections_it_adds() -> None:
    """A pool of 2 for 8 at once, 0.1 s each, a connection's set-up 0.3 s: the batch takes
    0.3 + 4 x 0.1 s; with 8 connections each pays its set-up, 0.3 + 0.1 s. The saving is the
    0.3 s between, not the 1.2 s of waits."""
    finding = found(diagnose(_queued(0.1, 0.3)), "pool-queue")
    assert "the 6 connections it adds pay their set-up first (300 ms each)" in finding.fix
    assert finding.saving is not None
    assert finding.saving.text().startswith("saves about 300 ms of the batch's wall time")
    assert finding.saving.seen == pytest.approx(0.3)


# -- each client's API ---------------------------------------------------------------------------


def _fresh(client: str, sdk: str | None = None) -> Call:
    attempt = Attempt(0, 0.1, (Phase("connect", 0.0, 0.05), Phase("wait", 0.05, 0.05)),
                      host="h", method="POST", status=200, reused=False, client=client)  # fmt: skip
    return Call("POST" if sdk is None else f"{sdk} chat.completions", 0, 0.1, [attempt], sdk=sdk)


@pytest.mark.parametrize(
    ("client", "sdk", "reuse", "pool"),
    [
        ("aiohttp", None, "aiohttp.ClientSession()",
         "aiohttp.TCPConnector(limit=9, limit_per_host=4)"),
        ("httpx", None, "httpx.Client()",
         "httpx.Limits(max_connections=9, max_keepalive_connections=9)"),
        ("httpx2", None, "httpx2.Client()",
         "httpx2.Limits(max_connections=9, max_keepalive_connections=9)"),
        ("urllib3", None, "requests.Session()",
         "requests.adapters.HTTPAdapter(pool_maxsize=4)"),
        ("httpx", "openai", "openai.OpenAI()",
         "httpx.Limits(max_connections=9, max_keepalive_connections=9)"),
    ],
)  # fmt: skip
def test_each_fix_names_the_api_of_the_client_in_use(
    client: str, sdk: str | None, reuse: str, pool: str
) -> None:
    """The client a fix names is the one the attempts came from (``llm_latency.client``), or
    the SDK whose span opened the calls; a pool of 4 per host and 9 in all."""
    from llm_latency.diagnosis.advice import pool_fix, reuse_fix

    calls = [_fresh(client, sdk)]
    change = reuse_fix(calls, calls[0].attempts)
    assert change is not None and change.call() == reuse
    sized = pool_fix(calls[0].attempts, 4, 9)
    assert sized is not None and sized.call() == pool
    assert reuse_fix([_fresh("")], []) is None  # a client the spans do not name: no Fix


def test_a_finding_s_fix_is_in_its_json() -> None:
    finding = found(diagnose(_queued(0.1, 0.3)), "pool-queue")
    data = finding.as_json()
    assert data["change"] == {
        "client": "aiohttp", "api": "aiohttp.TCPConnector", "how": "configure",
        "settings": {"limit": 8, "limit_per_host": 8},
        "call": "aiohttp.TCPConnector(limit=8, limit_per_host=8)",
    }  # fmt: skip
    assert data["saving"]["kind"] == "wall" and data["saving"]["seen"] == pytest.approx(0.3)
