"""Every client through a real proxy (tinyproxy on loopback): an HTTPS target through a
``CONNECT`` tunnel and a plain HTTP target in absolute form, with the proxy given as an
argument and through the environment. The attempt is the request to the target, the tunnel is
its ``proxy`` phase, and the proxy's address and URL (never its credentials) are recorded.

A run whose phases miss their bounds (the server's injected wait) by no more than what the
machine measurably took meanwhile (the run-queue waits of this process's threads and of the
proxy's, ``tests/cpu_waits.py``, and the garbage collector's pauses) runs again, up to three
times; any other miss fails at once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
import requests
import trustme
from opentelemetry.trace import StatusCode

from tests.attributes import attributes
from tests.checks import int_value, server_phase_misses
from tests.command_line import mock_server, probe_json
from tests.conftest import Telemetry
from tests.cpu_waits import collector_pauses, machine_waits
from tests.httpx_clients import KINDS, Client
from tests.proxy_server import PROXY_HOST, Proxy, tinyproxy
from tests.servers import LLMServer

CLIENTS = ["aiohttp", *KINDS, "requests"]
PROXY_VARIABLES = (
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
    "http_proxy", "https_proxy", "all_proxy", "no_proxy",
)  # fmt: skip

every_client = pytest.mark.parametrize("kind", CLIENTS)
#: Runs of a timed test at most, when what the machine took covers a miss.
TRIES = 3


@pytest.fixture(scope="module")
def proxy() -> Iterator[Proxy]:
    with tinyproxy() as running:
        yield running


@pytest.fixture(scope="module")
def auth_proxy() -> Iterator[Proxy]:
    with tinyproxy(auth=("llm-user", "s3cret-pass")) as running:
        yield running


@pytest.fixture(scope="module")
def refusing_proxy() -> Iterator[Proxy]:
    """A proxy that opens tunnels to port 443 only: a CONNECT to a test server gets 403."""
    with tinyproxy(connect_ports=(443,)) as running:
        yield running


@pytest.fixture(scope="module")
def ca_file(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


@pytest.fixture
def no_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The proxy variables of the machine running the tests are not the test's."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@contextlib.contextmanager
def machine_took(took: list[float] | None, pids: tuple[int, ...]) -> Iterator[None]:
    """Appends to ``took`` (when given) how long the machine kept this process's threads and
    the processes ``pids`` from a CPU while the block ran (s). Measured around each request,
    while the proxy's thread that serves its connection is alive."""
    if took is None:
        yield
        return
    with machine_waits(os.getpid(), *pids) as waited:
        yield
    took.append(waited.peers)


async def fetch(
    kind: str,
    urls: list[str],
    *,
    proxy: str | None,
    trust_env: bool = False,
    client_ssl: ssl.SSLContext,
    ca_file: str,
    took: list[float] | None = None,
    pids: tuple[int, ...] = (),
) -> list[int]:
    """GET each of ``urls`` with one client of ``kind`` (one pool), reading each body; the
    status codes. ``proxy``: the proxy argument, if any; ``trust_env``: read the environment;
    ``took``: gets what the machine took from this process and ``pids`` during each request."""
    statuses: list[int] = []
    if kind == "aiohttp":
        async with aiohttp.ClientSession(trust_env=trust_env) as session:
            for url in urls:
                with machine_took(took, pids):
                    async with session.get(url, proxy=proxy, ssl=client_ssl) as response:
                        await response.read()
                        statuses.append(response.status)
    elif kind == "requests":

        def run() -> None:
            with requests.Session() as session:
                session.trust_env = trust_env
                proxies = {"http": proxy, "https": proxy} if proxy else None
                for url in urls:
                    with machine_took(took, pids):
                        response = session.get(url, proxies=proxies, verify=ca_file, timeout=10)
                    statuses.append(response.status_code)

        await asyncio.to_thread(run)
    else:
        options: dict[str, Any] = {"verify": client_ssl, "trust_env": trust_env}
        if proxy is not None:
            options["proxy"] = proxy
        async with Client(kind, **options) as client:
            for url in urls:
                with machine_took(took, pids):
                    statuses.append((await client.request("GET", url)).status)
    return statuses


async def fetch_through(
    proxy: Proxy,
    how: str,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    urls: list[str],
    *,
    client_ssl: ssl.SSLContext,
    ca_file: str,
    took: list[float] | None = None,
) -> list[int]:
    """:func:`fetch` through ``proxy``, given to the client as its argument
    (``how="argument"``) or in the environment (``how="environment"``)."""
    if how == "environment":
        via_environment(monkeypatch, proxy)
    return await fetch(
        kind,
        urls,
        proxy=proxy.url if how == "argument" else None,
        trust_env=how == "environment",
        client_ssl=client_ssl,
        ca_file=ca_file,
        took=took,
        pids=(proxy.pid,),
    )


async def timed_through(
    telemetry: Telemetry,
    proxy: Proxy,
    how: str,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    urls: list[str],
    *,
    client_ssl: ssl.SSLContext,
    ca_file: str,
    wait: float,
) -> None:
    """:func:`fetch_through` (each answer 200), each request's phases within their bounds
    around the server's ``wait`` (``server_phase_misses``). A run that misses them by no more
    than what the machine measurably took (the run-queue waits of this process's threads and
    of the proxy's, and the garbage collector's pauses: a process kept from a CPU forwards or
    answers that late) runs again, up to TRIES times; any other miss fails at once."""
    for _ in range(TRIES):
        telemetry.exporter.clear()  # a run again: only its own attempts
        took: list[float] = []
        with collector_pauses() as collected:
            statuses = await fetch_through(
                proxy, how, monkeypatch, kind, urls,
                client_ssl=client_ssl, ca_file=ca_file, took=took,
            )  # fmt: skip
        assert statuses == [200] * len(urls)
        requests = telemetry.requests()
        assert len(requests) == len(urls)
        found = [m for r in requests for m in server_phase_misses(telemetry.phases(r), wait, 0.0)]
        machine = sum(took) + collected.seconds
        if not found or max(by for by, _ in found) > machine:
            break
    assert not found, (
        f"{found}; the machine kept this process and the proxy from a CPU for {sum(took):.3f} s, "
        f"the garbage collector ran {collected.seconds:.3f} s"
    )


def via_environment(monkeypatch: pytest.MonkeyPatch, proxy: Proxy) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)


@every_client
@pytest.mark.parametrize("how", ["argument", "environment"])
async def test_tunnel_to_an_https_target(
    telemetry: Telemetry,
    tls_server: LLMServer,
    proxy: Proxy,
    client_ssl: ssl.SSLContext,
    ca_file: str,
    no_proxy_variables: pytest.MonkeyPatch,
    kind: str,
    how: str,
) -> None:
    url = tls_server.url(host="localhost", wait=0.2)
    await timed_through(
        telemetry, proxy, how, no_proxy_variables, kind, [url, url],
        client_ssl=client_ssl, ca_file=ca_file, wait=0.2,
    )  # fmt: skip
    # One attempt per request: the CONNECT exchange is no attempt of its own.
    first, second = telemetry.requests()
    for request in (first, second):
        found = attributes(request)
        assert found["server.address"] == "localhost"
        assert found["server.port"] == tls_server.port
        assert found["network.peer.address"] == PROXY_HOST
        assert found["llm_latency.proxy.url"] == proxy.origin
        assert found["http.response.status_code"] == 200
        assert found["http.response.header.x-request-id"] == ("req_test_123",)
    assert attributes(first)["llm_latency.connection.reused"] is False
    phases = telemetry.phases(first)
    assert set(phases) == {"connect", "proxy", "tls", "send", "wait", "receive"}
    assert phases["connect"].end_time <= phases["proxy"].start_time  # type: ignore[operator]
    assert phases["proxy"].end_time <= phases["tls"].start_time  # type: ignore[operator]
    assert attributes(second)["llm_latency.connection.reused"] is True
    assert set(telemetry.phases(second)) == {"send", "wait", "receive"}


@every_client
@pytest.mark.parametrize("how", ["argument", "environment"])
async def test_plain_http_target_in_absolute_form(
    telemetry: Telemetry,
    server: LLMServer,
    proxy: Proxy,
    client_ssl: ssl.SSLContext,
    ca_file: str,
    no_proxy_variables: pytest.MonkeyPatch,
    kind: str,
    how: str,
) -> None:
    url = server.url(host="localhost", wait=0.2)
    await timed_through(
        telemetry, proxy, how, no_proxy_variables, kind, [url],
        client_ssl=client_ssl, ca_file=ca_file, wait=0.2,
    )  # fmt: skip
    request = telemetry.request()
    found = attributes(request)
    assert found["server.address"] == "localhost"
    assert found["server.port"] == server.port
    assert found["url.full"] == url
    assert found["network.peer.address"] == PROXY_HOST
    assert found["llm_latency.proxy.url"] == proxy.origin
    # No tunnel: the proxy's forwarding is inside the wait.
    assert set(telemetry.phases(request)) == {"connect", "send", "wait", "receive"}


@every_client
async def test_no_proxy_goes_direct(
    telemetry: Telemetry,
    server: LLMServer,
    proxy: Proxy,
    client_ssl: ssl.SSLContext,
    ca_file: str,
    no_proxy_variables: pytest.MonkeyPatch,
    kind: str,
) -> None:
    via_environment(no_proxy_variables, proxy)
    no_proxy_variables.setenv("NO_PROXY", "localhost")
    statuses = await fetch(
        kind,
        [server.url(host="localhost")],
        proxy=None,
        trust_env=True,
        client_ssl=client_ssl,
        ca_file=ca_file,
    )
    assert statuses == [200]
    found = attributes(telemetry.request())
    assert found["network.peer.address"] == "127.0.0.1"
    assert "llm_latency.proxy.url" not in found


@every_client
@pytest.mark.parametrize("target", ["https", "http"])
async def test_proxy_credentials_never_reach_a_span(
    telemetry: Telemetry,
    server: LLMServer,
    tls_server: LLMServer,
    auth_proxy: Proxy,
    client_ssl: ssl.SSLContext,
    ca_file: str,
    no_proxy_variables: pytest.MonkeyPatch,
    kind: str,
    target: str,
) -> None:
    """The proxy wants Basic auth (it answers 407 without it): the credentials in its URL get
    the requests through, and appear nowhere in what is exported."""
    url = (tls_server if target == "https" else server).url(host="localhost")
    statuses = await fetch(
        kind, [url], proxy=auth_proxy.url, client_ssl=client_ssl, ca_file=ca_file
    )
    assert statuses == [200]
    found = attributes(telemetry.request())
    assert found["llm_latency.proxy.url"] == auth_proxy.origin
    assert_no_credentials(telemetry, "llm-user", "s3cret-pass")


@every_client
async def test_credentials_of_a_refused_proxy_never_reach_a_span(
    telemetry: Telemetry,
    tls_server: LLMServer,
    auth_proxy: Proxy,
    client_ssl: ssl.SSLContext,
    ca_file: str,
    no_proxy_variables: pytest.MonkeyPatch,
    kind: str,
) -> None:
    """A wrong password: the proxy refuses the tunnel (tinyproxy answers 401), and the
    exception recorded does not carry the password (aiohttp's quotes the proxy's URL)."""
    wrong = auth_proxy.url.replace("s3cret-pass", "wr0ng-pass")
    with pytest.raises(Exception, match=r"40[17]|Unauthorized"):
        await fetch(
            kind, [tls_server.url(host="localhost")], proxy=wrong, client_ssl=client_ssl,
            ca_file=ca_file,
        )  # fmt: skip
    assert attributes(telemetry.request())["llm_latency.failed_phase"] == "proxy"
    assert_no_credentials(telemetry, "llm-user", "wr0ng-pass")


def assert_no_credentials(telemetry: Telemetry, *secrets: str) -> None:
    for span in telemetry.spans():
        shown = repr(dict(span.attributes or {})) + repr([e.attributes for e in span.events])
        for secret in secrets:
            assert secret not in shown, (span.name, secret)


@every_client
async def test_a_refused_tunnel_fails_in_the_proxy_phase(
    telemetry: Telemetry,
    tls_server: LLMServer,
    refusing_proxy: Proxy,
    client_ssl: ssl.SSLContext,
    ca_file: str,
    no_proxy_variables: pytest.MonkeyPatch,
    kind: str,
) -> None:
    with pytest.raises(Exception, match=r"403|Forbidden"):
        await fetch(
            kind,
            [tls_server.url(host="localhost")],
            proxy=refusing_proxy.url,
            client_ssl=client_ssl,
            ca_file=ca_file,
        )
    request = telemetry.request()
    found = attributes(request)
    assert found["llm_latency.failed_phase"] == "proxy"
    assert found["network.peer.address"] == PROXY_HOST
    assert "http.response.status_code" not in found  # the proxy's 403 is no answer of the target
    phases = telemetry.phases(request)
    assert set(phases) == {"connect", "proxy"}
    failed = phases["proxy"]
    assert failed.status.status_code is StatusCode.ERROR
    assert attributes(failed)["error.type"] == found["error.type"]
    assert tls_server.requests == type(tls_server.requests)()  # nothing reached the target


def open_connections(telemetry: Telemetry) -> dict[tuple[str, str], int]:
    """``http.client.open_connections`` now, by (server.address, state)."""
    found: dict[tuple[str, str], int] = {}
    data = telemetry.reader.get_metrics_data()
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != "http.client.open_connections":
                    continue
                for point in metric.data.data_points:
                    point_attributes = dict(point.attributes or {})
                    key = (
                        str(point_attributes["server.address"]),
                        str(point_attributes["http.connection.state"]),
                    )
                    found[key] = found.get(key, 0) + int_value(point)
    return {key: count for key, count in found.items() if count}


async def test_aiohttp_pools_a_tunnel_as_a_connection_to_the_target(
    telemetry: Telemetry, tls_server: LLMServer, proxy: Proxy, client_ssl: ssl.SSLContext
) -> None:
    """The connection pool counts a tunnel under the target it leads to, never the proxy."""
    async with aiohttp.ClientSession() as session:
        url = tls_server.url(host="localhost")
        async with session.get(url, proxy=proxy.url, ssl=client_ssl) as response:
            await response.read()
        assert open_connections(telemetry) == {("localhost", "idle"): 1}
    assert open_connections(telemetry) == {}


@pytest.mark.parametrize("client", ["aiohttp", "httpx2", "requests"])
def test_probe_goes_through_the_environments_proxy(proxy: Proxy, client: str) -> None:
    """probe runs inside the user's network: every client it offers honours ``HTTPS_PROXY``
    (aiohttp only with ``trust_env``), and the tunnel is the request's proxy phase."""
    env: dict[str, str | None] = {name: None for name in PROXY_VARIABLES}
    env["HTTPS_PROXY"] = proxy.url
    with mock_server("--tls", "--tokens", "1") as mock:
        assert mock.ca_file is not None
        report = probe_json(
            mock.url, "--cacert", mock.ca_file, "-n", "1", "--client", client, env=env
        )
    (request,) = report["requests"]
    assert request["status"] == 200
    assert {"connect", "proxy", "tls"} <= set(request["phases"])
