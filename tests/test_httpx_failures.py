"""httpx and httpx2 failures: the program sees what it sees uninstrumented; the failed phase
span ends ERROR with ``error.type`` and the exception event; no span is left open.

(Name resolution failures are not run here: httpcore resolves through the system resolver, and
the tests send no traffic beyond loopback. The aiohttp tests cover a failing DNS server.)"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import pytest

from tests.attributes import attributes
from tests.bad_servers import BlackHole
from tests.checks import assert_failed, compare, full_backlog
from tests.conftest import Telemetry
from tests.httpx_clients import KINDS, Client
from tests.servers import LLMServer, unused_port

ALL_KINDS = pytest.mark.parametrize("kind", KINDS)


def timeout(kind: str, **kwargs: Any) -> Any:
    module: Any = __import__(kind.split("-")[0])
    return module.Timeout(5.0, **kwargs)


async def once(kind: str, method: str, url: str, **kwargs: Any) -> None:
    options = {k: kwargs.pop(k) for k in ("timeout", "verify", "limits") if k in kwargs}
    async with Client(kind, **options) as client:
        await client.request(method, url, **kwargs)


@ALL_KINDS
async def test_connection_refused(telemetry: Telemetry, kind: str) -> None:
    url = f"http://127.0.0.1:{unused_port()}/v1/models"
    outcome = await compare(telemetry, lambda: once(kind, "GET", url))
    assert outcome.kind is not None and outcome.kind.__name__ == "ConnectError"
    assert_failed(telemetry, "connect", "ConnectError")


@ALL_KINDS
async def test_connect_timeout(telemetry: Telemetry, kind: str) -> None:
    with full_backlog() as port:
        url = f"http://127.0.0.1:{port}/v1/models"
        outcome = await compare(
            telemetry, lambda: once(kind, "GET", url, timeout=timeout(kind, connect=0.2))
        )
    assert outcome.kind is not None and outcome.kind.__name__ == "ConnectTimeout"
    assert_failed(telemetry, "connect", "ConnectTimeout")


@ALL_KINDS
async def test_tls_verification_failure(
    telemetry: Telemetry, tls_server: LLMServer, kind: str
) -> None:
    url = tls_server.url(host="localhost")
    outcome = await compare(telemetry, lambda: once(kind, "GET", url))
    assert outcome.kind is not None and outcome.kind.__name__ == "ConnectError"
    assert "CERTIFICATE_VERIFY_FAILED" in outcome.text
    assert_failed(telemetry, "tls", "ConnectError")


@ALL_KINDS
async def test_tls_handshake_timeout(
    telemetry: Telemetry, client_ssl: ssl.SSLContext, kind: str
) -> None:
    silent = BlackHole(read=False)
    try:
        url = f"https://localhost:{silent.port}/v1/models"
        outcome = await compare(
            telemetry,
            lambda: once(kind, "GET", url, verify=client_ssl, timeout=timeout(kind, connect=0.2)),
        )
    finally:
        silent.close()
    assert outcome.kind is not None and outcome.kind.__name__ == "ConnectTimeout"
    assert_failed(telemetry, "tls", "ConnectTimeout")


@ALL_KINDS
async def test_read_timeout_while_waiting(
    telemetry: Telemetry, server: LLMServer, kind: str
) -> None:
    url = server.url(wait=1.0)
    outcome = await compare(
        telemetry, lambda: once(kind, "POST", url, json={}, timeout=timeout(kind, read=0.2))
    )
    assert outcome.kind is not None and outcome.kind.__name__ == "ReadTimeout"
    assert_failed(telemetry, "wait", "ReadTimeout")


@ALL_KINDS
async def test_read_timeout_mid_stream(telemetry: Telemetry, server: LLMServer, kind: str) -> None:
    url = server.url(chunks=3, gap=1.0, sse=1)
    outcome = await compare(
        telemetry, lambda: once(kind, "GET", url, stream=True, timeout=timeout(kind, read=0.2))
    )
    assert outcome.kind is not None and outcome.kind.__name__ == "ReadTimeout"
    assert_failed(telemetry, "receive", "ReadTimeout")


@ALL_KINDS
@pytest.mark.parametrize("sse", [0, 1], ids=["body", "stream"])
async def test_server_resets_mid_body(
    telemetry: Telemetry, server: LLMServer, kind: str, sse: int
) -> None:
    url = server.url(chunks=5, gap=0.05, reset=2, sse=sse)
    outcome = await compare(telemetry, lambda: once(kind, "GET", url))
    assert outcome.kind is not None
    error_type = outcome.kind.__name__
    assert error_type in ("RemoteProtocolError", "ReadError")
    assert_failed(telemetry, "receive", error_type)


@ALL_KINDS
async def test_pool_timeout(telemetry: Telemetry, server: LLMServer, kind: str) -> None:
    """The only connection is held by a first request, which the server answers only once the
    second has given up waiting for it (the pool timeout, 0.2 s): the second fails in its queue
    phase, in whichever order and however late a loaded machine starts the two (a sync
    client's requests run in threads of their own)."""

    async def scenario() -> None:
        module: Any = __import__(kind.split("-")[0])
        headers, arrived, release = server.holding()
        async with Client(
            kind, limits=module.Limits(max_connections=1), timeout=timeout(kind, pool=0.2)
        ) as client:
            first = asyncio.ensure_future(client.request("GET", server.url(), headers=headers))
            try:
                await asyncio.wait_for(arrived.wait(), 30)  # a guard against a hang, not a bound
                await client.request("GET", server.url())  # raises what the second one raised
            finally:
                release.set()
                await first

    outcome = await compare(telemetry, scenario)
    assert outcome.kind is not None and outcome.kind.__name__ == "PoolTimeout"
    failed = [r for r in telemetry.requests() if r.attributes and "error.type" in r.attributes]
    assert len(failed) == 1
    assert attributes(failed[0])["llm_latency.failed_phase"] == "queue"


@pytest.mark.parametrize("kind", [k for k in KINDS if k.endswith("async")])
@pytest.mark.parametrize(("phase", "query", "after"), [
    ("wait", {"wait": 1.0}, 0.2),
    ("receive", {"chunks": 10, "gap": 0.1, "sse": 1}, 0.3),
])  # fmt: skip
async def test_cancellation(
    telemetry: Telemetry, server: LLMServer, kind: str, phase: str, query: dict[str, Any],
    after: float,
) -> None:  # fmt: skip
    async def scenario() -> None:
        headers, arrived = server.arrival()
        task = asyncio.ensure_future(
            once(kind, "GET", server.url(**query), stream=True, headers=headers)
        )
        # ``after`` counts from the server's receipt of the request, not from the start: a
        # loaded machine can take longer than ``after`` to import, connect and send.
        await asyncio.wait_for(arrived.wait(), 30)  # a guard against a hang, not a bound
        await asyncio.sleep(after)
        task.cancel()
        await task

    outcome = await compare(telemetry, scenario)
    assert outcome.kind is asyncio.CancelledError
    assert_failed(telemetry, phase, "CancelledError")
