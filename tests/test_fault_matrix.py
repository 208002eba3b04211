"""Never break the host program: the faults the per-client failure tests leave out, for every
client, each run without and then with the plugin (``compare``): the program sees the same
result or exception, every span started ends exactly once, and the spans say where it failed.

Fault -> what each client raises -> failed phase / ``error.type`` (``httpx`` is httpx and
httpx2, sync and async: the four behave alike):

TLS, certificate for ``other.test`` only (trusted CA), reached as ``localhost``
    aiohttp   ClientConnectorCertificateError      -> tls / ClientConnectorCertificateError
    httpx     ConnectError ("Hostname mismatch")   -> tls / ConnectError
    requests  requests.exceptions.SSLError         -> tls / SSLError
Server reads the request, closes before any header
    aiohttp   ServerDisconnectedError              -> wait / ServerDisconnectedError, twice:
              aiohttp resends the GET once; the second attempt has resend_count 1 and a link
              to the first
    httpx     RemoteProtocolError                  -> wait / RemoteProtocolError
    requests  requests.ConnectionError             -> wait / RemoteDisconnected (http.client's)
Malformed status line (``HTTP/1.1 abc OK``)
    aiohttp   ClientResponseError (400)            -> wait / ClientResponseError
    httpx     RemoteProtocolError                  -> wait / RemoteProtocolError
    requests  requests.ConnectionError             -> wait / BadStatusLine (http.client's)
Header line without a colon
    aiohttp   ClientResponseError (400)            -> wait / ClientResponseError
    httpx     RemoteProtocolError                  -> wait / RemoteProtocolError
    requests  no error: 200, the body read to the close (http.client drops the headers after
              the bad line) -> no failed phase, no error.type, status 200, receive, the
              headers before the bad line captured
Truncated chunked body (chunk size 0x100, 3 bytes sent, then FIN)
    aiohttp   ClientPayloadError                   -> receive / ClientPayloadError
    httpx     RemoteProtocolError                  -> receive / RemoteProtocolError
    requests  requests.ChunkedEncodingError        -> receive / ProtocolError (urllib3's)
Body ends at the close (no Content-Length, not chunked; an SSE stream): not a fault
    all       200 and the whole stream             -> no failed phase, no error.type
Cancellation of the task (async clients; requests and sync httpx cannot be cancelled)
    queue     aiohttp, httpx async: CancelledError -> queue / CancelledError
    connect   aiohttp, httpx async: CancelledError -> connect / CancelledError
    tls       httpx async:          CancelledError -> tls / CancelledError
    send      aiohttp, httpx async: CancelledError -> send / CancelledError (16 MB body, the
              peer never reads)
    (dns, tls for aiohttp, wait and receive: test_aiohttp_failures, test_httpx_failures;
    dns for httpx is not run: httpcore resolves through the system resolver)
OTLP collector that accepts connections and never answers (a subprocess; requests, httpx,
httpx2 and aiohttp, batch export every 100 ms, exporter timeout 1 s)
    requests take as long as without the plugin (none stalls), shutdown is bounded (~2.5 s
    here), every span ends once, the exporters' own requests are not traced.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp
import httpx
import httpx2
import pytest
import requests
import trustme
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from tests.attributes import attributes
from tests.bad_servers import BlackHole, RawServer
from tests.checks import assert_failed, compare, full_backlog
from tests.conftest import Telemetry
from tests.httpx_clients import KINDS, Client
from tests.servers import LLMServer, llm_server

CLIENTS = ["aiohttp", *KINDS, "requests"]
ASYNC_HTTPX = [kind for kind in KINDS if kind.endswith("async")]


@dataclass(frozen=True)
class Trust:
    """How each client is told to trust the test CA."""

    context: ssl.SSLContext
    bundle: str  # requests takes a file


@pytest.fixture(scope="module")
def trust(ca: trustme.CA, client_ssl: ssl.SSLContext, tmp_path_factory: Any) -> Trust:
    bundle = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    return Trust(client_ssl, str(bundle))


def module_of(kind: str) -> Any:
    return httpx2 if kind.startswith("httpx2") else httpx


def family(kind: str) -> str:
    return "httpx" if kind in KINDS else kind


async def fetch(kind: str, url: str, *, trust: Trust | None = None) -> tuple[int, bytes]:
    """GET ``url`` with a fresh session or client of ``kind`` and read the whole body."""
    if kind == "aiohttp":
        connector = aiohttp.TCPConnector(ssl=trust.context if trust else True)
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            async with session.get(url) as response:
                return response.status, await response.read()
    if kind == "requests":

        def work() -> tuple[int, bytes]:
            with requests.Session() as session:
                verify: str | bool = trust.bundle if trust else True
                response = session.get(url, timeout=10, verify=verify)
                return response.status_code, response.content

        return await asyncio.to_thread(work)
    async with Client(kind, verify=trust.context if trust else True, timeout=10) as client:
        result = await client.request("GET", url)
        return result.status, result.body


def failed_requests(telemetry: Telemetry) -> list[ReadableSpan]:
    return [r for r in telemetry.requests() if r.attributes and "error.type" in r.attributes]


# -- TLS: the certificate names another host ------------------------------------------------


@pytest.fixture
async def other_name_server(ca: trustme.CA) -> AsyncIterator[LLMServer]:
    """An HTTPS server whose certificate (from the trusted test CA) is for ``other.test``
    only: reached as ``localhost``, the name does not match."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("other.test").configure_cert(context)
    async with llm_server(ssl_context=context) as server:
        yield server


TLS_NAME = {
    "aiohttp": ("ClientConnectorCertificateError", "ClientConnectorCertificateError"),
    "httpx": ("ConnectError", "ConnectError"),
    "requests": ("SSLError", "SSLError"),
}


@pytest.mark.parametrize("kind", CLIENTS)
async def test_tls_certificate_for_another_name(
    telemetry: Telemetry, other_name_server: LLMServer, trust: Trust, kind: str
) -> None:
    url = other_name_server.url(host="localhost")
    outcome = await compare(telemetry, lambda: fetch(kind, url, trust=trust))
    program_sees, error_type = TLS_NAME[family(kind)]
    assert outcome.kind is not None and outcome.kind.__name__ == program_sees
    # The CA is trusted: the failure is the name, not the chain.
    assert "Hostname mismatch" in outcome.text
    assert_failed(telemetry, "tls", error_type)
    assert {"connect", "tls"} <= set(telemetry.phases(telemetry.request()))


# -- crafted responses from a raw socket ----------------------------------------------------

FAULTS: dict[str, bytes] = {
    # The request is read, then the server closes without a byte.
    "closed-before-headers": b"",
    "malformed-status-line": b"HTTP/1.1 abc OK\r\nContent-Length: 2\r\n\r\n{}",
    "header-without-colon": (
        b"HTTP/1.1 200 OK\r\n"
        b"Content-Type: application/json\r\n"
        b"x-request-id: req_bad_header\r\n"
        b"this line has no colon\r\n"
        b"Content-Length: 2\r\n"
        b"\r\n{}"
    ),
    # A chunk announces 0x100 bytes, three are sent, then the server closes.
    "truncated-chunked-body": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n100\r\nabc",
    # No Content-Length, not chunked: the body (a stream, here) ends when the server closes.
    # Not a fault: HTTP/1.0 servers and some proxies answer this way.
    "body-ends-at-close": (
        b"HTTP/1.1 200 OK\r\n"
        b"Content-Type: text/event-stream\r\n"
        b"x-request-id: req_until_close\r\n"
        b"\r\n"
        b"data: {}\n\ndata: [DONE]\n\n"
    ),
}

# fault -> family -> (what the program sees, failed phase, error.type); phase None: success.
EXPECTED: dict[str, dict[str, tuple[str, str | None, str | None]]] = {
    "closed-before-headers": {
        "aiohttp": ("ServerDisconnectedError", "wait", "ServerDisconnectedError"),
        "httpx": ("RemoteProtocolError", "wait", "RemoteProtocolError"),
        "requests": ("ConnectionError", "wait", "RemoteDisconnected"),
    },
    "malformed-status-line": {
        "aiohttp": ("ClientResponseError", "wait", "ClientResponseError"),
        "httpx": ("RemoteProtocolError", "wait", "RemoteProtocolError"),
        "requests": ("ConnectionError", "wait", "BadStatusLine"),
    },
    "header-without-colon": {
        "aiohttp": ("ClientResponseError", "wait", "ClientResponseError"),
        "httpx": ("RemoteProtocolError", "wait", "RemoteProtocolError"),
        "requests": ("200", None, None),
    },
    "truncated-chunked-body": {
        "aiohttp": ("ClientPayloadError", "receive", "ClientPayloadError"),
        "httpx": ("RemoteProtocolError", "receive", "RemoteProtocolError"),
        "requests": ("ChunkedEncodingError", "receive", "ProtocolError"),
    },
    "body-ends-at-close": {
        "aiohttp": ("200", None, None),
        "httpx": ("200", None, None),
        "requests": ("200", None, None),
    },
}


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_crafted_response(telemetry: Telemetry, fault: str, kind: str) -> None:
    program_sees, phase, error_type = EXPECTED[fault][family(kind)]
    results: list[tuple[int, bytes]] = []

    async def scenario() -> None:
        results.append(await fetch(kind, server.url()))

    with RawServer(FAULTS[fault]) as server:
        outcome = await compare(telemetry, scenario)
    if phase is None:  # a success for the program: the span must say so too
        assert outcome.kind is None
        assert results[0] == results[1]
        assert results[1][0] == int(program_sees)
        request = telemetry.request()
        assert attributes(request)["http.response.status_code"] == int(program_sees)
        failure = [attributes(request).get(k) for k in ("llm_latency.failed_phase", "error.type")]
        assert failure == [None, None]
        assert request.status.status_code is StatusCode.UNSET
        assert set(telemetry.phases(request)) == {"connect", "send", "wait", "receive"}
        if fault == "header-without-colon":
            # http.client keeps the headers before the bad line (and drops the rest, so the
            # body is read to the close).
            assert attributes(request)["http.response.header.x-request-id"] == ("req_bad_header",)
        else:
            assert results[1][1] == b"data: {}\n\ndata: [DONE]\n\n"
            assert attributes(request)["http.response.header.x-request-id"] == ("req_until_close",)
            assert attributes(request)["llm_latency.stream.events"] == 2
        return
    assert outcome.kind is not None and outcome.kind.__name__ == program_sees
    assert error_type is not None
    if fault == "closed-before-headers" and kind == "aiohttp":
        # aiohttp resends an idempotent request once after a disconnect: two attempts, both
        # cut in wait, the second linked to the first.
        first, second = sorted(telemetry.requests(), key=lambda s: s.start_time or 0)
        for attempt in (first, second):
            assert_failed(telemetry, phase, error_type, attempt)
        assert attributes(second)["http.request.resend_count"] == 1
        assert first.context is not None
        assert [link.context.span_id for link in second.links] == [first.context.span_id]
        return
    assert_failed(telemetry, phase, error_type)
    request = telemetry.request()
    if phase == "receive":  # the headers came: the status is on the span
        assert attributes(request)["http.response.status_code"] == 200
    else:
        assert "http.response.status_code" not in attributes(request)


# -- cancellation in each phase (async clients) -----------------------------------------------

#: A request body larger than loopback's socket buffers: the send blocks on a peer that never
#: reads.
BIG_BODY = b"x" * (16 << 20)


async def cancel_when(
    request: Callable[[], Awaitable[Any]], ready: Callable[[], bool], then: float = 0.15
) -> None:
    """Run ``request`` as a task; once ``ready()`` (polled) and ``then`` seconds more, cancel
    it, and await it."""
    task = asyncio.ensure_future(request())
    for _ in range(1000):  # 10 s at most
        if ready() or task.done():
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(then)
    task.cancel()
    await task


def accepted(peer: BlackHole) -> Callable[[], bool]:
    """Ready once ``peer`` accepted one more connection than now."""
    before = peer.connections
    return lambda: peer.connections > before


def always() -> bool:
    return True


async def cancel_at_connect(request: Callable[[], Awaitable[Any]], port: int) -> None:
    """Run ``request`` as a task and cancel it at its TCP connect to ``port``: in the step that
    calls the event loop's ``sock_connect`` (asyncio's ``create_connection`` does), before the
    connect syscall, so the cancellation lands in the connect phase whatever the machine's load.
    A cancel timed from outside lands wherever the task happens to be: with the event loop held
    (descheduled) across both, in the same iteration as a deadline of the client's own (anyio's
    happy-eyeballs delay, 0.25 s from the start of its connect attempt), whose cancel reaches
    the task first and gives the program ``CancelledError("Cancelled via cancel scope <id>")``
    instead of the test's own, in one run and not the other, or with another id. Here the
    connecting step was scheduled before that deadline existed, so it runs before its timer."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(request())
    connect = loop.sock_connect

    async def sock_connect(sock: socket.socket, address: Any) -> None:
        if address[1] == port:
            task.cancel()
        await connect(sock, address)

    with mock.patch.object(loop, "sock_connect", sock_connect):
        await task


async def test_aiohttp_cancelled_while_queued(telemetry: Telemetry, server: LLMServer) -> None:
    async def scenario() -> None:
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector) as session:
            holder = await session.get(server.url(chunks=3, gap=0.5))  # holds the connection
            try:
                await cancel_when(lambda: session.get(server.url()), always)
            finally:
                holder.close()

    outcome = await compare(telemetry, scenario)
    assert outcome.kind is asyncio.CancelledError
    (failed,) = failed_requests(telemetry)
    assert_failed(telemetry, "queue", "CancelledError", failed)
    assert set(telemetry.phases(failed)) == {"queue"}


async def test_aiohttp_cancelled_in_connect(telemetry: Telemetry) -> None:
    with full_backlog() as port:  # the TCP handshake never completes

        async def scenario() -> None:
            async with aiohttp.ClientSession() as session:
                url = f"http://127.0.0.1:{port}/v1/models"
                await cancel_when(lambda: session.get(url), always)

        outcome = await compare(telemetry, scenario)
    assert outcome.kind is asyncio.CancelledError
    assert_failed(telemetry, "connect", "CancelledError")
    assert set(telemetry.phases(telemetry.request())) == {"connect"}


async def test_aiohttp_cancelled_in_send(telemetry: Telemetry) -> None:
    with BlackHole(read=False) as peer:

        async def scenario() -> None:
            async with aiohttp.ClientSession() as session:
                url = f"http://127.0.0.1:{peer.port}/v1/chat/completions"
                await cancel_when(lambda: session.post(url, data=BIG_BODY), accepted(peer), 0.3)

        outcome = await compare(telemetry, scenario)
    assert outcome.kind is asyncio.CancelledError
    assert_failed(telemetry, "send", "CancelledError")
    assert set(telemetry.phases(telemetry.request())) == {"connect", "send"}


@pytest.mark.parametrize("kind", ASYNC_HTTPX)
async def test_httpx_cancelled_while_queued(
    telemetry: Telemetry, server: LLMServer, kind: str
) -> None:
    module = module_of(kind)

    async def scenario() -> None:
        async with module.AsyncClient(limits=module.Limits(max_connections=1)) as client:
            seen = len(server.requests)
            holder = asyncio.ensure_future(client.get(server.url(wait=0.6)))
            try:
                # Once the server has the holder's request, the only connection is taken.
                await cancel_when(lambda: client.get(server.url()),
                                  lambda: len(server.requests) > seen)  # fmt: skip
            finally:
                await holder

    outcome = await compare(telemetry, scenario)
    assert outcome.kind is asyncio.CancelledError
    (failed,) = failed_requests(telemetry)
    assert_failed(telemetry, "queue", "CancelledError", failed)
    assert set(telemetry.phases(failed)) == {"queue"}
    (holder,) = [r for r in telemetry.requests() if r is not failed]
    assert attributes(holder)["http.response.status_code"] == 200


@pytest.mark.parametrize("kind", ASYNC_HTTPX)
async def test_httpx_cancelled_in_connect(telemetry: Telemetry, kind: str) -> None:
    with full_backlog() as port:  # the TCP handshake never completes

        async def scenario() -> None:
            async with module_of(kind).AsyncClient() as client:
                url = f"http://127.0.0.1:{port}/v1/models"
                await cancel_at_connect(lambda: client.get(url), port)

        outcome = await compare(telemetry, scenario)
    assert outcome.kind is asyncio.CancelledError
    assert_failed(telemetry, "connect", "CancelledError")
    assert set(telemetry.phases(telemetry.request())) == {"connect"}


@pytest.mark.parametrize("kind", ASYNC_HTTPX)
async def test_httpx_cancelled_in_tls(
    telemetry: Telemetry, client_ssl: ssl.SSLContext, kind: str
) -> None:
    with BlackHole() as peer:  # reads the ClientHello, never answers it

        async def scenario() -> None:
            async with module_of(kind).AsyncClient(verify=client_ssl) as client:
                url = f"https://127.0.0.1:{peer.port}/v1/models"
                await cancel_when(lambda: client.get(url), accepted(peer))

        outcome = await compare(telemetry, scenario)
    assert outcome.kind is asyncio.CancelledError
    assert_failed(telemetry, "tls", "CancelledError")
    assert set(telemetry.phases(telemetry.request())) == {"connect", "tls"}


@pytest.mark.parametrize("kind", ASYNC_HTTPX)
async def test_httpx_cancelled_in_send(telemetry: Telemetry, kind: str) -> None:
    with BlackHole(read=False) as peer:

        async def scenario() -> None:
            async with module_of(kind).AsyncClient() as client:
                url = f"http://127.0.0.1:{peer.port}/v1/chat/completions"
                await cancel_when(lambda: client.post(url, content=BIG_BODY), accepted(peer), 0.3)

        outcome = await compare(telemetry, scenario)
    assert outcome.kind is asyncio.CancelledError
    assert_failed(telemetry, "send", "CancelledError")
    assert set(telemetry.phases(telemetry.request())) == {"connect", "send"}


# -- an OTLP collector that accepts and never answers ---------------------------------------

#: Times requests per client before and after instrument(), exporting to a hanging collector.
HANGING_COLLECTOR_PROGRAM = Path(__file__).parent / "programs" / "hanging_collector.py"


def test_hanging_otlp_collector_does_not_slow_the_program(tmp_path: Path) -> None:
    requests_per_client = 30
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    with BlackHole() as collector:
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, str(HANGING_COLLECTOR_PROGRAM), str(collector.port),
             str(requests_per_client)],
            capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
        )  # fmt: skip
        elapsed = time.monotonic() - began
        assert done.returncode == 0, done.stderr
        assert "llm-latency" not in done.stderr  # nothing went wrong inside the plugin
        # The exporters did try: they connected and sent their requests, and got no answer.
        assert collector.connections >= 1
        assert collector.received > 0
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for client in ("requests", "httpx", "httpx2", "aiohttp"):
        bare, traced = result["bare"][client], result["traced"][client]
        assert len(traced) == requests_per_client
        # About as fast as without the plugin; an export blocking a request would cost 1 s.
        assert sum(traced) <= 3 * sum(bare) + 1.0, (client, sum(bare), sum(traced))
        assert max(traced) < 0.8, (client, max(traced))
    # Shutdown is bounded by the exporters' 1 s timeouts, not by the hanging collector.
    assert result["shutdown"] < 15.0, result["shutdown"]
    assert elapsed < 50.0
    # Every span ended once; the exporters' own HTTP requests were not traced (suppressed).
    assert set(result["started"]) <= set(result["ended"])
    assert len(set(result["ended"])) == len(result["ended"])
    request_spans = [port for port in result["ports"] if port is not None]
    assert len(request_spans) == 4 * requests_per_client
    assert collector.port not in request_spans
