"""What llm-latency shows on two network paths, per client (the numbers of
docs/network-paths.md):

1. Through a proxy: HTTPS requests to a loopback server (0.1 s to the first byte) through
   Debian's tinyproxy, each on a new connection (a new client), against the same requests
   made directly. p50 of the connection set-up phases (``connect`` is the TCP connect to the
   proxy, ``proxy`` the ``CONNECT`` tunnel, ``tls`` the handshake with the target through it)
   and of the whole attempt.
2. A name with two addresses, the first dead (it never answers): the connect phase and the
   address used (``network.peer.address``).

    python bench/network_paths.py    # needs tinyproxy (apt-get install tinyproxy)
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trustme

import llm_latency
from tests.attributes import attributes
from tests.conftest import Telemetry, seconds
from tests.proxy_server import Hosts, blackhole, tinyproxy
from tests.servers import llm_server
from tests.test_addresses import DEAD, NAME, get
from tests.test_proxies import CLIENTS, fetch

REQUESTS = 7
SETUP = ("connect", "proxy", "tls")


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:7.1f}" if values else "      -"


async def through(kind: str, url: str, proxy: str | None, ctx: ssl.SSLContext, ca: str) -> str:
    telemetry = Telemetry()
    telemetry.instrument()
    try:
        for _ in range(REQUESTS):
            await fetch(kind, [url], proxy=proxy, client_ssl=ctx, ca_file=ca)
    finally:
        llm_latency.uninstrument()
    phases: dict[str, list[float]] = {name: [] for name in (*SETUP, "wait")}
    totals = []
    for request in telemetry.requests():
        totals.append(seconds(request))
        for name, span in telemetry.phases(request).items():
            if name in phases:
                phases[name].append(seconds(span))
    cells = "  ".join(ms(phases[name]) for name in (*SETUP, "wait"))
    return f"{kind:<13} {'proxy' if proxy else 'direct':<7} {cells}  {ms(totals)}"


async def several_addresses(kind: str, port: int) -> str:
    telemetry = Telemetry()
    telemetry.instrument()
    try:
        await get(kind, f"http://{NAME}:{port}/v1/chat/completions")
    finally:
        llm_latency.uninstrument()
    request = telemetry.request()
    connect = seconds(telemetry.phases(request)["connect"])
    peer = attributes(request)["network.peer.address"]
    return f"{kind:<13} connect {connect * 1000:6.1f} ms  network.peer.address {peer}"


async def main() -> None:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    with tempfile.TemporaryDirectory() as folder, tinyproxy() as proxy:
        ca_file = str(Path(folder) / "ca.pem")
        ca.cert_pem.write_to_path(ca_file)
        async with llm_server(ssl_context=server_ctx) as server:
            url = server.url(host="localhost", wait=0.1)
            print(f"p50 of {REQUESTS} requests, each on a new connection (ms)")
            print(f"{'client':<13} {'path':<7} connect    proxy      tls     wait    total")
            for kind in CLIENTS:
                for via in (None, proxy.url):
                    print(await through(kind, url, via, client_ctx, ca_file))
    hosts = Hosts(socket.getaddrinfo)
    setattr(socket, "getaddrinfo", hosts.getaddrinfo)  # noqa: B010 (before instrument())
    try:
        async with llm_server() as plain:
            hosts.names[NAME] = [DEAD, plain.host]
            print(f"\n{NAME} -> {DEAD} (never answers), {plain.host}")
            with blackhole(DEAD, plain.port):
                for kind in CLIENTS:
                    print(await several_addresses(kind, plain.port))
    finally:
        setattr(socket, "getaddrinfo", hosts._original)  # noqa: B010


if __name__ == "__main__":
    asyncio.run(main())
