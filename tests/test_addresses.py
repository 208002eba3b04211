"""A host name with several addresses, the first of them dead: every client records the address
it actually used (``network.peer.address``), and its connect phase includes the time lost on
the dead one (aiohttp and anyio race the next address after a happy-eyeballs delay of 0.25 s;
the sync clients try the addresses in turn, each until the connect timeout)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import httpx
import httpx2
import pytest
import requests

from tests.attributes import attributes
from tests.conftest import Telemetry, seconds
from tests.httpx_clients import KINDS, Client
from tests.proxy_server import Hosts, blackhole
from tests.servers import LLMServer

CLIENTS = ["aiohttp", *KINDS, "requests"]
#: The dead address answers nothing: the clients give up on it after this long (s).
HAPPY_EYEBALLS_DELAY = 0.25
CONNECT_TIMEOUT = 0.5
NAME = "several.test"
DEAD = "127.0.0.3"

pytestmark = pytest.mark.parametrize("kind", CLIENTS)


@pytest.fixture
def hosts(monkeypatch: pytest.MonkeyPatch) -> Hosts:
    """Requested before ``telemetry``, so that llm-latency's dns hook wraps it."""
    table = Hosts(socket.getaddrinfo)
    monkeypatch.setattr(socket, "getaddrinfo", table.getaddrinfo)
    return table


def lost_on_the_dead_address(kind: str) -> float:
    """How long the client waits on an address that never answers before it uses the next."""
    return HAPPY_EYEBALLS_DELAY if kind == "aiohttp" or kind.endswith("async") else CONNECT_TIMEOUT


async def get(kind: str, url: str) -> int:
    if kind == "aiohttp":
        # aiohttp's resolver on getaddrinfo (its default is aiodns when installed).
        connector = aiohttp.TCPConnector(
            happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY, resolver=aiohttp.ThreadedResolver()
        )
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.get(url) as response,
        ):
            await response.read()
            return response.status
    if kind == "requests":

        def run() -> int:
            with requests.Session() as session:
                return session.get(url, timeout=(CONNECT_TIMEOUT, 10)).status_code

        return await asyncio.to_thread(run)
    module: Any = httpx2 if kind.startswith("httpx2") else httpx
    async with Client(kind, timeout=module.Timeout(10.0, connect=CONNECT_TIMEOUT)) as client:
        return (await client.request("GET", url)).status


async def test_the_address_used_and_the_time_lost_on_a_dead_one(
    hosts: Hosts, telemetry: Telemetry, server: LLMServer, kind: str
) -> None:
    hosts.names[NAME] = [DEAD, server.host]
    with blackhole(DEAD, server.port):
        status = await get(kind, server.url(host=NAME))
    assert status == 200
    request = telemetry.request()
    found = attributes(request)
    assert found["server.address"] == NAME
    assert found["network.peer.address"] == server.host
    phases = telemetry.phases(request)
    assert {"dns", "connect"} <= set(phases)
    assert seconds(phases["connect"]) >= lost_on_the_dead_address(kind) - 0.01


async def test_a_live_first_address_costs_nothing_more(
    hosts: Hosts, telemetry: Telemetry, server: LLMServer, kind: str
) -> None:
    """The same name with the live address first: the connect phase is short, which shows the
    dead address's time above is what that test injected."""
    hosts.names[NAME] = [server.host, DEAD]
    with blackhole(DEAD, server.port):
        assert await get(kind, server.url(host=NAME)) == 200
    request = telemetry.request()
    assert attributes(request)["network.peer.address"] == server.host
    assert seconds(telemetry.phases(request)["connect"]) < lost_on_the_dead_address(kind)
