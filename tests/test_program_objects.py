"""The program's own objects stay as they were: the headers mappings a program passes (a dict,
urllib3's ``HTTPHeaderDict``, a pool's or a session's defaults) never gain ``traceparent``,
during the request or after ``uninstrument()``; and ``propagate=False`` (or its variable) keeps
the trace context off the wire of every client while the spans stay."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
import httpx2
import pytest
import requests
import urllib3
from aiohttp import web
from requests.structures import CaseInsensitiveDict
from urllib3 import HTTPHeaderDict

import llm_latency
from llm_latency.adapters import requests as requests_adapter
from tests.conftest import Telemetry
from tests.servers import serving

PATH = "/v1/chat/completions"


@dataclass
class Peer:
    """A loopback server that answers every request and keeps the headers it got."""

    port: int
    seen: list[dict[str, str]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{PATH}"

    def traceparents(self) -> list[str | None]:
        return [headers.get("traceparent") for headers in self.seen]


@pytest.fixture
async def peer() -> AsyncIterator[Peer]:
    server = Peer(0)

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        fields = request.headers
        server.seen.append({k.lower(): ", ".join(fields.getall(k)) for k in fields})
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    async with serving(app) as server.port:
        yield server


def snapshot(headers: Any) -> list[tuple[str, str]]:
    """A mapping's fields, repeated ones included, in order."""
    items = headers.iteritems() if hasattr(headers, "iteritems") else headers.items()
    return [(str(k), str(v)) for k, v in items]


# -- each client, with the program's own mappings --------------------------------------------


async def test_urllib3_leaves_every_mapping_as_it_was(telemetry: Telemetry, peer: Peer) -> None:
    pool = urllib3.HTTPConnectionPool("127.0.0.1", peer.port, headers={"x-pool": "1"})
    mine = HTTPHeaderDict({"x-mine": "a"})
    mine.add("x-mine", "b")  # a repeated field: the copy that is sent must keep both
    plain = {"x-plain": "1"}
    before = [snapshot(pool.headers), snapshot(mine), snapshot(plain)]

    def work() -> None:
        pool.request("POST", PATH, body=b"{}")  # the pool's defaults
        pool.urlopen("POST", PATH, body=b"{}", headers=mine)
        pool.urlopen("POST", PATH, body=b"{}", headers=plain)
        urllib3.request("POST", peer.url, body=b"{}", headers=mine)

    await asyncio.to_thread(work)
    assert [snapshot(pool.headers), snapshot(mine), snapshot(plain)] == before
    assert all(peer.traceparents()), peer.seen  # each request carried it on the wire
    assert peer.seen[1]["x-mine"] == "a, b"
    llm_latency.uninstrument()
    await asyncio.to_thread(pool.request, "POST", PATH, body=b"{}")
    # No stale traceparent left in the pool's defaults for the requests after.
    assert peer.traceparents()[-1] is None
    assert [snapshot(pool.headers), snapshot(mine), snapshot(plain)] == before
    assert len(telemetry.requests()) == 4


async def test_requests_leaves_the_session_and_the_prepared_request(
    telemetry: Telemetry, peer: Peer
) -> None:
    session = requests.Session()
    session.headers["x-session"] = "1"
    mine = {"x-mine": "1"}
    prepared = session.prepare_request(requests.Request("POST", peer.url, json={}))
    before = [dict(session.headers), dict(mine), dict(prepared.headers)]

    def work() -> None:
        session.post(peer.url, json={}, headers=mine)
        session.send(prepared)

    await asyncio.to_thread(work)
    assert [dict(session.headers), dict(mine), dict(prepared.headers)] == before
    assert len(peer.traceparents()) == 2 and all(peer.traceparents())
    llm_latency.uninstrument()
    await asyncio.to_thread(session.send, prepared)
    assert peer.traceparents()[-1] is None
    assert [dict(session.headers), dict(mine), dict(prepared.headers)] == before


def test_requests_headers_copy_as_their_own_copy_would() -> None:
    """The copy of requests' headers that is sent (made apart from its own ``copy()``, which
    is dearer) is what ``copy()`` and ``update()`` make: the same type, fields, order and
    case-insensitive replacement; the program's mapping is left as it was."""
    # A propagator's keys may have capitals (B3's X-B3-TraceId), the program's fields too.
    carrier = {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "X-B3-TraceId": "a" * 32}

    class Subclass(CaseInsensitiveDict[str]):
        pass

    for kind in (CaseInsensitiveDict, Subclass):
        mine = kind(
            {"Content-Type": "application/json", "TraceParent": "old", "x-b3-traceid": "old"}
        )
        before = list(mine.items())
        expected = mine.copy()
        expected.update(carrier)
        sent = requests_adapter._with(mine, carrier)
        assert type(sent) is type(expected)
        assert list(sent.items()) == list(expected.items())
        assert sent["TRACEPARENT"] == carrier["traceparent"] and len(sent) == 3
        assert sent["x-b3-traceid"] == carrier["X-B3-TraceId"]
        sent["x-later"] = "1"  # the copy is the program's no more
        assert list(mine.items()) == before


async def test_aiohttp_leaves_the_session_and_the_call_headers(
    telemetry: Telemetry, peer: Peer
) -> None:
    mine = {"x-mine": "1"}
    async with aiohttp.ClientSession(headers={"x-session": "1"}) as session:
        before = [snapshot(session.headers), dict(mine)]
        async with session.post(peer.url, json={}, headers=mine) as response:
            await response.read()
        assert [snapshot(session.headers), dict(mine)] == before
        llm_latency.uninstrument()
        async with session.post(peer.url, json={}, headers=mine) as response:
            await response.read()
        assert [snapshot(session.headers), dict(mine)] == before
    assert peer.traceparents()[0] and peer.traceparents()[1] is None


@pytest.mark.parametrize("module", [httpx, httpx2], ids=["httpx", "httpx2"])
async def test_httpx_leaves_the_client_and_the_call_headers(
    telemetry: Telemetry, peer: Peer, module: Any
) -> None:
    mine = {"x-mine": "1"}
    async with module.AsyncClient(headers={"x-client": "1"}) as client:
        before = [snapshot(client.headers), dict(mine)]
        await client.post(peer.url, json={}, headers=mine)
        assert [snapshot(client.headers), dict(mine)] == before
        llm_latency.uninstrument()
        await client.post(peer.url, json={}, headers=mine)
        assert [snapshot(client.headers), dict(mine)] == before
    assert peer.traceparents()[0] and peer.traceparents()[1] is None


# -- propagation off ---------------------------------------------------------------------------


def _aiohttp(url: str) -> Callable[[], Any]:
    async def call() -> None:
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json={}) as response:
                await response.read()

    return call


def _httpx(url: str) -> Callable[[], Any]:
    async def call() -> None:
        async with httpx.AsyncClient() as client:
            await client.post(url, json={})

    return call


def _sync(work: Callable[[], Any]) -> Callable[[], Any]:
    async def call() -> None:
        await asyncio.to_thread(work)

    return call


CALLS: dict[str, Callable[[str], Callable[[], Any]]] = {
    "aiohttp": _aiohttp,
    "httpx": _httpx,
    "httpx sync": lambda url: _sync(lambda: httpx.post(url, json={})),
    "httpx2": lambda url: _sync(lambda: httpx2.post(url, json={})),
    "requests": lambda url: _sync(lambda: requests.post(url, json={}, timeout=10)),
    "urllib3": lambda url: _sync(lambda: urllib3.request("POST", url, body=b"{}")),
}


@pytest.mark.parametrize("client", sorted(CALLS))
@pytest.mark.parametrize("how", ["argument", "variable"])
async def test_propagation_off_keeps_traceparent_off_the_wire(
    peer: Peer, client: str, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    telemetry = Telemetry()
    if how == "variable":
        monkeypatch.setenv("OTEL_PYTHON_LLM_LATENCY_PROPAGATE", "false")
        telemetry.instrument()
    else:
        telemetry.instrument(propagate=False)
    try:
        await CALLS[client](peer.url)()
    finally:
        llm_latency.uninstrument()
    assert peer.traceparents() == [None]
    (request,) = telemetry.requests()  # the span is made all the same, with its phases
    assert {"send", "wait", "receive"} <= set(telemetry.phases(request))


async def test_propagation_is_on_by_default(telemetry: Telemetry, peer: Peer) -> None:
    await CALLS["requests"](peer.url)()
    (request,) = telemetry.requests()
    (traceparent,) = peer.traceparents()
    assert traceparent is not None
    assert request.context is not None
    assert f"{request.context.span_id:016x}" in traceparent
