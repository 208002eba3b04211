"""requests (urllib3 underneath): phases against injected delays, streams, urllib3's own retries
as attempts, failures compared with and without the plugin, secrets."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any

import pytest
import requests
from opentelemetry.trace import StatusCode
from requests.adapters import HTTPAdapter
from urllib3.util import Retry

from llm_latency.testing import HandshakeDelay
from tests.attributes import attributes, float_attr, int_attr
from tests.bad_servers import BlackHole
from tests.checks import (
    SLACK,
    assert_about,
    assert_failed,
    assert_server_phases,
    assert_tiles,
    compare,
    full_backlog,
)
from tests.conftest import Telemetry, seconds
from tests.servers import LLMServer, unused_port


async def in_thread(work: Callable[[], Any]) -> Any:
    return await asyncio.to_thread(work)


async def test_fresh_then_pooled(telemetry: Telemetry, server: LLMServer) -> None:
    def work() -> None:
        with requests.Session() as session:
            url = server.url(host="localhost", wait=0.3, chunks=4, gap=0.1)
            assert session.post(url, json={"m": 1}).content.startswith(b"chunk0")
            session.get(server.url(host="localhost"))

    await in_thread(work)
    first, second = telemetry.requests()
    phases = telemetry.phases(first)
    assert set(phases) == {"dns", "connect", "send", "wait", "receive"}
    assert_server_phases(phases, wait=0.3, receive=0.3)
    assert set(telemetry.phases(second)) == {"send", "wait", "receive"}
    attrs = first.attributes
    assert attrs is not None
    assert first.name == "POST /v1/chat/completions"
    assert attrs["llm_latency.connection.reused"] is False
    assert attrs["http.response.header.x-request-id"] == ("req_test_123",)
    assert attrs["network.protocol.version"] == "1.1"
    assert second.attributes is not None
    assert second.attributes["llm_latency.connection.reused"] is True
    assert_tiles(telemetry)
    assert "traceparent" in server.requests[0]["headers"]


async def test_tls_phase(
    telemetry: Telemetry, tls_server: LLMServer, ca: Any, tmp_path: Any
) -> None:
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    async with HandshakeDelay(tls_server.port, delay=0.25) as proxy:
        url = f"https://localhost:{proxy.port}/v1/chat/completions"
        response = await in_thread(lambda: requests.post(url, json={}, verify=str(bundle)))
    assert response.status_code == 200
    phases = telemetry.phases(telemetry.request())
    assert set(phases) == {"dns", "connect", "tls", "send", "wait", "receive"}
    assert_about(seconds(phases["tls"]), 0.25)
    assert_tiles(telemetry)


async def test_blocking_pool_queues(telemetry: Telemetry, server: LLMServer) -> None:
    session = requests.Session()
    session.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=1, pool_block=True))
    url = server.url(wait=0.2)
    await asyncio.gather(*(in_thread(lambda: session.get(url)) for _ in range(3)))
    session.close()
    queued = sorted(
        seconds(p["queue"]) for p in map(telemetry.phases, telemetry.requests()) if "queue" in p
    )
    assert len(queued) == 2
    assert_about(queued[0], 0.2)
    assert_about(queued[1], 0.4)


async def test_streamed_response(telemetry: Telemetry, server: LLMServer) -> None:
    def work() -> list[bytes]:
        with requests.get(server.url(wait=0.2, chunks=5, gap=0.1, sse=1), stream=True) as r:
            return list(r.iter_lines())

    lines = await in_thread(work)
    assert b"data: [DONE]" in lines
    request = telemetry.request()
    attrs = request.attributes
    assert attrs is not None
    assert 0.2 - 0.005 <= float_attr(request, "gen_ai.response.time_to_first_chunk") <= 0.2 + SLACK
    assert attrs["llm_latency.stream.events"] == 6
    assert 0.1 - 0.005 <= float_attr(request, "llm_latency.stream.max_gap") <= 0.1 + SLACK
    assert_server_phases(telemetry.phases(request), wait=0.2, receive=0.4)


async def test_stream_closed_early(telemetry: Telemetry, server: LLMServer) -> None:
    def work() -> None:
        response = requests.get(server.url(chunks=20, gap=0.1, sse=1), stream=True)
        next(response.iter_lines())
        response.close()

    await in_thread(work)
    request = telemetry.request()
    assert seconds(request) < 1.0
    assert request.status.status_code is StatusCode.UNSET


async def test_urllib3_retries_are_attempts(telemetry: Telemetry, server: LLMServer) -> None:
    retry = Retry(total=2, status_forcelist=[503], backoff_factor=0, allowed_methods=None)

    def work() -> None:
        with requests.Session() as session:
            session.mount("http://", HTTPAdapter(max_retries=retry))
            session.get(server.url(status=503))

    with pytest.raises(requests.exceptions.RetryError):
        await in_thread(work)
    attempts = sorted(telemetry.requests(), key=lambda s: s.start_time or 0)
    assert [attributes(a).get("http.request.resend_count", 0) for a in attempts] == [0, 1, 2]
    assert {int_attr(a, "http.response.status_code") for a in attempts} == {503}
    telemetry.assert_all_ended_once()


async def test_no_secret_is_exported(telemetry: Telemetry, server: LLMServer) -> None:
    secrets = ["sk-bearer-secret-1", "api-key-secret-2", "query-secret-3", "body-secret-4"]
    url = server.url() + f"&key={secrets[2]}" if "?" in server.url() else server.url()
    url = f"{url}?api_key={secrets[2]}&token={secrets[2]}"

    def work() -> None:
        requests.post(
            url,
            headers={"Authorization": f"Bearer {secrets[0]}", "x-api-key": secrets[1],
                     "Cookie": "session=cookie-secret-5"},
            json={"content": secrets[3]},
            auth=None,
        )  # fmt: skip
        requests.get(f"http://user:pw-secret-6@127.0.0.1:{server.port}/v1/models")

    await in_thread(work)
    exported = "".join(s.to_json() for s in telemetry.spans())
    data = telemetry.reader.get_metrics_data()
    exported += data.to_json() if data is not None else ""
    for secret in [*secrets, "cookie-secret-5", "pw-secret-6", "cookie-secret-9c1d"]:
        assert secret not in exported


# -- failures: urllib3's exception on the span, requests' one for the program -------------------


async def test_connection_refused(telemetry: Telemetry) -> None:
    url = f"http://127.0.0.1:{unused_port()}/v1/models"
    outcome = await compare(telemetry, lambda: in_thread(lambda: requests.get(url)))
    assert outcome.kind is requests.exceptions.ConnectionError
    assert_failed(telemetry, "connect", "NewConnectionError")


async def test_connect_timeout(telemetry: Telemetry) -> None:
    with full_backlog() as port:
        url = f"http://127.0.0.1:{port}/v1/models"
        outcome = await compare(
            telemetry, lambda: in_thread(lambda: requests.get(url, timeout=(0.2, 5)))
        )
    assert outcome.kind is requests.exceptions.ConnectTimeout
    assert_failed(telemetry, "connect", "ConnectTimeoutError")


async def test_tls_verification_failure(telemetry: Telemetry, tls_server: LLMServer) -> None:
    url = tls_server.url(host="localhost")
    outcome = await compare(telemetry, lambda: in_thread(lambda: requests.get(url)))
    assert outcome.kind is requests.exceptions.SSLError
    assert_failed(telemetry, "tls", "SSLError")


async def test_tls_handshake_timeout(
    telemetry: Telemetry, ca: Any, tmp_path: Any, client_ssl: ssl.SSLContext
) -> None:
    silent = BlackHole(read=False)
    try:
        url = f"https://localhost:{silent.port}/v1/models"
        outcome = await compare(
            telemetry, lambda: in_thread(lambda: requests.get(url, timeout=(0.2, 0.2)))
        )
    finally:
        silent.close()
    assert outcome.kind is not None
    assert outcome.kind.__name__ in ("ConnectTimeout", "ReadTimeout", "SSLError")
    request = telemetry.request()
    assert request.attributes is not None
    assert request.attributes["llm_latency.failed_phase"] == "tls"


async def test_read_timeout_while_waiting(telemetry: Telemetry, server: LLMServer) -> None:
    url = server.url(wait=1.0)
    outcome = await compare(
        telemetry, lambda: in_thread(lambda: requests.get(url, timeout=(5, 0.2)))
    )
    assert outcome.kind is requests.exceptions.ReadTimeout
    assert_failed(telemetry, "wait", "ReadTimeoutError")


async def test_read_timeout_mid_stream(telemetry: Telemetry, server: LLMServer) -> None:
    url = server.url(chunks=3, gap=1.0, sse=1)
    outcome = await compare(
        telemetry, lambda: in_thread(lambda: requests.get(url, timeout=(5, 0.2)).content)
    )
    assert outcome.kind is requests.exceptions.ConnectionError
    assert_failed(telemetry, "receive", "ReadTimeoutError")


async def test_server_resets_mid_body(telemetry: Telemetry, server: LLMServer) -> None:
    url = server.url(chunks=5, gap=0.05, reset=2, sse=1)
    outcome = await compare(telemetry, lambda: in_thread(lambda: requests.get(url).content))
    assert outcome.kind is requests.exceptions.ChunkedEncodingError
    assert_failed(telemetry, "receive", "ProtocolError")
