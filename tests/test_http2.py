"""HTTP/2 (httpx and httpx2 with ``http2=True``) against a real HTTP/2 server on loopback:
hypercorn over TLS, in a thread of its own, with a low ``SETTINGS_MAX_CONCURRENT_STREAMS``.

One connection carries every request; the requests beyond the server's stream limit wait for a
free stream, and that wait is their ``http.queue`` (not an unexplained gap before the send);
the pool metrics count the HTTP/2 connection and the requests waiting on it; the diagnosis
names the stream limit, not the pool's size.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import trustme
from hypercorn.asyncio import serve
from hypercorn.config import Config

from llm_latency import diagnose
from tests.conftest import Telemetry, seconds
from tests.servers import unused_port

pytestmark = pytest.mark.xdist_group("timing")

#: The server's time per request (s): each bound below is a share of it.
WAIT = 0.2
REQUESTS = 6
KINDS = ["httpx", "httpx2"]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class H2Server:
    """An HTTP/2 server over TLS on loopback; ``hold`` keeps each answer back until it is set
    (``in_flight``: the requests being answered now)."""

    url: str
    context: ssl.SSLContext
    hold: threading.Event
    in_flight: list[int]
    two_in_flight: threading.Event


@pytest.fixture
def h2_server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[H2Server]:
    streams: int = getattr(request, "param", 2)
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(certfile))
    cert.private_key_pem.write_to_path(str(keyfile))
    port = unused_port()
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.certfile, config.keyfile = str(certfile), str(keyfile)
    config.h2_max_concurrent_streams = streams
    config.accesslog = None
    config.errorlog = None
    hold = threading.Event()
    hold.set()
    in_flight: list[int] = [0]
    two_in_flight = threading.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        in_flight[0] += 1
        if in_flight[0] >= 2:
            two_in_flight.set()
        try:
            await asyncio.to_thread(hold.wait, 30)
            await asyncio.sleep(WAIT)
        finally:
            in_flight[0] -= 1
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})

    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)

        async def main() -> None:
            started.set()
            await serve(app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]

        loop.run_until_complete(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(10)
    context = ssl.create_default_context()
    ca.configure_trust(context)
    try:
        yield H2Server(f"https://127.0.0.1:{port}/v1/chat/completions", context, hold,
                       in_flight, two_in_flight)  # fmt: skip
    finally:
        hold.set()
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


def client(kind: str, context: ssl.SSLContext) -> Any:
    module: Any = httpx2 if kind == "httpx2" else httpx
    return module.AsyncClient(http2=True, verify=context)


async def until_listening(server: H2Server, kind: str) -> None:
    """The server thread accepts connections (one request on a client of its own)."""
    for _ in range(200):
        try:
            async with client(kind, server.context) as first:
                await first.get(server.url)
            return
        except (httpx.ConnectError, httpx2.ConnectError):
            await asyncio.sleep(0.05)
    raise AssertionError("the HTTP/2 server did not start")


async def burst(kind: str, server: H2Server, during: Callable[[], Awaitable[None]]) -> None:
    async with client(kind, server.context) as http:

        async def one() -> None:
            response = await http.post(server.url, json={})
            assert response.http_version == "HTTP/2"

        await asyncio.gather(during(), *(one() for _ in range(REQUESTS)))


async def nothing() -> None:
    return None


@dataclass
class Row:
    """One attempt: its start (from the first attempt's) and duration, and each phase's start
    (from the attempt's) and duration (s)."""

    start: float
    duration: float
    phases: dict[str, tuple[float, float]]

    def took(self, phase: str) -> float:
        return self.phases[phase][1] if phase in self.phases else 0.0

    def ends(self, phase: str) -> float:
        """When ``phase`` ended, from the first attempt's start."""
        start, duration = self.phases[phase]
        return self.start + start + duration

    @property
    def untiled(self) -> float:
        """The attempt's time in no phase: the client's own work between phases."""
        return self.duration - sum(duration for _, duration in self.phases.values())


def rows_of(telemetry: Telemetry) -> list[Row]:
    """The attempts, in start order; each went over HTTP/2."""
    rows = []
    attempts = sorted(telemetry.attempts(), key=lambda a: a.start_time or 0)
    first = attempts[0].start_time or 0
    for attempt in attempts:
        assert (attempt.attributes or {}).get("network.protocol.version") == "2"
        start = attempt.start_time or 0
        phases = {
            name: (((span.start_time or 0) - start) / 1e9, seconds(span))
            for name, span in telemetry.phases(attempt).items()
        }
        rows.append(Row((start - first) / 1e9, seconds(attempt), phases))
    return rows


@pytest.mark.parametrize("kind", KINDS)
async def test_requests_beyond_the_stream_limit_queue(
    telemetry: Telemetry, h2_server: H2Server, kind: str
) -> None:
    """Six requests on one connection that runs two at once: four wait at least one answer
    (WAIT) for a stream, in http.queue, not in a gap before their send."""
    await until_listening(h2_server, kind)
    telemetry.exporter.clear()
    await burst(kind, h2_server, nothing)
    rows = rows_of(telemetry)
    assert len(rows) == REQUESTS
    assert len([r for r in rows if r.took("queue") >= WAIT * 0.9]) >= REQUESTS - 2, rows
    for row in rows:
        # Less than a stream's wait is left out of the phases: the client's own work.
        assert row.untiled < WAIT, row
        assert {"send", "wait", "receive"} <= set(row.phases)
    # One connection for all: one attempt opened it.
    assert len([r for r in rows if "connect" in r.phases]) == 1, rows
    findings = {f.rule: f for f in diagnose(telemetry.spans())}
    assert "pool-queue" not in findings  # no pool limit was reached
    found = findings["http2-stream-limit"]
    assert found.evidence.count >= REQUESTS - 2
    assert "the server let 2 run at once on the connection" in found.cause
    assert "max_connections" in found.fix


@pytest.mark.parametrize("h2_server", [100], indirect=True)
@pytest.mark.parametrize("kind", KINDS)
async def test_no_stream_limit_finding_without_one(
    telemetry: Telemetry, h2_server: H2Server, kind: str
) -> None:
    """The same burst on a fresh connection to a server that runs 100 streams at once: the
    requests that wait for the connection another one opens waited for no stream."""
    await until_listening(h2_server, kind)
    telemetry.exporter.clear()
    await burst(kind, h2_server, nothing)
    rows = rows_of(telemetry)
    (opener,) = [r for r in rows if "connect" in r.phases]
    for row in rows:
        assert row.untiled < WAIT, row
        if "queue" in row.phases:
            # Sent before the first answer came: it waited for the connection, not a stream.
            assert row.ends("queue") < opener.ends("wait"), (row, opener)
    rules = [f.rule for f in diagnose(telemetry.spans())]
    assert "http2-stream-limit" not in rules and "pool-queue" not in rules


def observed(telemetry: Telemetry, name: str) -> dict[str, int]:
    """The points of one pool metric, by ``http.connection.state`` (or "" without one)."""
    return {
        str(dict(point.attributes).get("http.connection.state", "")): point.value
        for point in telemetry.metric_points(name)
    }


@pytest.mark.parametrize("kind", KINDS)
async def test_pool_metrics_count_the_http2_connection_and_its_requests(
    telemetry: Telemetry, h2_server: H2Server, kind: str
) -> None:
    """Read while the server holds two streams: one connection, active; six requests in
    flight, four of them waiting for a stream."""
    await until_listening(h2_server, kind)
    h2_server.hold.clear()
    h2_server.two_in_flight.clear()
    seen: dict[str, dict[str, int]] = {}

    async def read_while_held() -> None:
        assert await asyncio.to_thread(h2_server.two_in_flight.wait, 30)
        for name in (
            "http.client.open_connections",
            "http.client.active_requests",
            "llm_latency.pool.waiting",
        ):
            seen[name] = observed(telemetry, name)
        h2_server.hold.set()

    await burst(kind, h2_server, read_while_held)
    assert seen["http.client.open_connections"] == {"active": 1, "idle": 0}, seen
    assert seen["http.client.active_requests"] == {"": REQUESTS}, seen
    assert seen["llm_latency.pool.waiting"] == {"": REQUESTS - 2}, seen
    # Once they are all answered, the connection is idle in the pool, until the client closes.
    assert observed(telemetry, "http.client.open_connections") == {"active": 0, "idle": 0}
