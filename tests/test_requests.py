"""requests (urllib3 underneath): phases against injected delays, streams, urllib3's own retries
as attempts, failures compared with and without the plugin, secrets."""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Callable
from typing import Any

import pytest
import requests
from dirty_equals import IsFloat
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode
from requests.adapters import HTTPAdapter
from urllib3.util import Retry

from llm_latency.testing import HandshakeDelay
from tests.attributes import attributes, float_attr, longest_gap_seen
from tests.bad_servers import BlackHole
from tests.checks import (
    SLACK,
    assert_about,
    assert_failed,
    assert_tiles,
    compare,
    full_backlog,
    served_within,
)
from tests.conftest import Telemetry, seconds
from tests.servers import LLMServer, unused_port
from tests.span_tree import phase_nodes, span_tree


async def in_thread(work: Callable[[], Any]) -> Any:
    return await asyncio.to_thread(work)


def first_request(telemetry: Telemetry) -> ReadableSpan:
    """The request span of the first of two requests."""
    first, _ = telemetry.requests()
    return first


def request_to(method: str, url: str, host: str = "127.0.0.1") -> dict[str, Any]:
    """A request span's attributes that come from its request to the test server's ``url``."""
    return {
        "http.request.method": method,
        "network.peer.address": "127.0.0.1",  # the test server listens there only
        "network.protocol.version": "1.1",
        "server.address": host,
        "server.port": "PORT",
        "url.full": re.sub(r":\d+/", ":PORT/", url, count=1),
        "url.template": "/v1/chat/completions",
    }


#: What every answer of the test server adds to its request span: its headers (captured by
#: default), and the network overhead they let the plugin measure.
SERVED = {
    "http.response.header.x-ratelimit-remaining-requests": ["42"],
    "http.response.header.x-ratelimit-remaining-tokens": ["9000"],
    "http.response.header.x-request-id": ["req_test_123"],
    "llm_latency.request_id": "req_test_123",
    "llm_latency.network_overhead": IsFloat(ge=0),
}


async def test_fresh_then_pooled(telemetry: Telemetry, server: LLMServer) -> None:
    url = server.url(host="localhost", wait=0.3, chunks=4, gap=0.1)

    def work() -> None:
        with requests.Session() as session:
            assert session.post(url, json={"m": 1}).content.startswith(b"chunk0")
            session.get(server.url(host="localhost"))

    await served_within(
        telemetry, lambda: in_thread(work), wait=0.3, receive=0.3, attempt=first_request
    )
    # The first request resolves the name and connects; the second reuses its connection.
    assert span_tree(telemetry.spans()) == [
        {
            "name": "POST /v1/chat/completions",
            "kind": "CLIENT",
            "attributes": {
                **request_to("POST", url, "localhost"),
                **SERVED,
                "http.response.header.openai-processing-ms": ["300"],
                "http.response.status_code": 200,
                "llm_latency.connection.reused": False,
                "llm_latency.server.processing_time": 0.3,
            },
            "children": phase_nodes("dns", "connect", "send", "wait", "receive", host="localhost"),
        },
        {
            "name": "GET /v1/chat/completions",
            "kind": "CLIENT",
            "attributes": {
                **request_to("GET", server.url(host="localhost"), "localhost"),
                **SERVED,
                "http.response.header.openai-processing-ms": ["0"],
                "http.response.status_code": 200,
                "llm_latency.connection.reused": True,
                "llm_latency.server.processing_time": 0.0,
            },
            "children": phase_nodes("send", "wait", "receive", host="localhost"),
        },
    ]
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

    lines: list[bytes] = []

    async def send() -> None:
        lines[:] = await in_thread(work)

    request = await served_within(telemetry, send, wait=0.2, receive=0.4)
    assert b"data: [DONE]" in lines
    assert span_tree(telemetry.spans()) == [
        {
            "name": "GET /v1/chat/completions",
            "kind": "CLIENT",
            "attributes": {
                **request_to("GET", server.url(wait=0.2, chunks=5, gap=0.1, sse=1)),
                **SERVED,
                "gen_ai.response.time_to_first_chunk": IsFloat(),
                "http.response.header.openai-processing-ms": ["200"],
                "http.response.status_code": 200,
                "llm_latency.connection.reused": False,
                "llm_latency.server.processing_time": 0.2,
                "llm_latency.stream.events": 6,  # five deltas and [DONE]
                # Its first delta's content, and no usage: OpenAI's without include_usage.
                "llm_latency.time_to_first_token": IsFloat(),
                "llm_latency.usage.unknown": True,
                "llm_latency.stream.max_gap": IsFloat(),
                "llm_latency.stream.mean_interval": IsFloat(),
                "llm_latency.stream.chunk_rate": IsFloat(),
            },
            "children": phase_nodes("connect", "send", "wait", "receive"),
        }
    ]
    assert 0.2 - 0.005 <= float_attr(request, "gen_ai.response.time_to_first_chunk") <= 0.2 + SLACK
    assert float_attr(request, "llm_latency.stream.max_gap") <= 0.1 + SLACK
    assert longest_gap_seen(request) >= 0.1 - 0.005


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
    # Three attempts, numbered, each a 503; urllib3's (zero) waits between them. With no span of
    # the program's around them, each is a root.
    unavailable = {
        **request_to("GET", server.url(status=503)),
        **SERVED,
        "error.type": "503",
        "http.response.header.openai-processing-ms": ["0"],
        "http.response.status_code": 503,
        "llm_latency.server.processing_time": 0.0,
    }
    wait = {
        "name": "retry.backoff",
        "kind": "INTERNAL",
        "attributes": {"llm_latency.backoff.reason": "503"},
    }
    assert span_tree(telemetry.spans()) == [
        {
            "name": "GET /v1/chat/completions",
            "kind": "CLIENT",
            "attributes": {**unavailable, "llm_latency.connection.reused": False},
            "children": phase_nodes("connect", "send", "wait", "receive"),
        },
        wait,
        {
            "name": "GET /v1/chat/completions",
            "kind": "CLIENT",
            "attributes": {
                **unavailable,
                "http.request.resend_count": 1,
                "llm_latency.connection.reused": True,
            },
            "children": phase_nodes("send", "wait", "receive"),
        },
        wait,
        {
            "name": "GET /v1/chat/completions",
            "kind": "CLIENT",
            "attributes": {
                **unavailable,
                "http.request.resend_count": 2,
                "llm_latency.connection.reused": True,
            },
            "children": phase_nodes("send", "wait", "receive"),
        },
    ]
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
    assert attributes(request)["llm_latency.failed_phase"] == "tls"


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
