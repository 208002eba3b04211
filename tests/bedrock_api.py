"""A loopback server that speaks enough of Amazon Bedrock's runtime API for the real boto3
client: Converse, ConverseStream, InvokeModel and InvokeModelWithResponseStream, streamed in
AWS's event-stream encoding (prelude, typed headers, payload, both CRC32s), Bedrock's response
headers, and scripted throttling (a model id ``throttle-N-NAME`` gets a 429
``ThrottlingException`` on its first N attempts). Also bedrock-agent-runtime's Retrieve, and a
bare S3 bucket (``HEAD /{bucket}``) for a call of another AWS service."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import re
import struct
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.servers import serving

WAIT = 0.05  # the model's "processing" before the headers
TOKENS = ["Hello", ",", " world", "!"]
TOKEN_GAP = 0.02
#: What the server says it spent on each request (x-amzn-bedrock-invocation-latency, ms).
INVOCATION_LATENCY_MS = 42
#: The prompt's tokens the server reports (the answer's are len(TOKENS)).
INPUT_TOKENS = 3
#: What InvokeModel's streams end with, inside the last chunk's payload, as Bedrock sends it.
INVOCATION_METRICS = {
    "inputTokenCount": INPUT_TOKENS,
    "outputTokenCount": len(TOKENS),
    "invocationLatency": INVOCATION_LATENCY_MS,
    "firstByteLatency": 10,
}
#: ConverseStream's events for TOKENS: messageStart, a delta per token, contentBlockStop,
#: messageStop and metadata.
CONVERSE_STREAM_EVENTS = len(TOKENS) + 4
EVENT_STREAM = "application/vnd.amazon.eventstream"
_THROTTLE = re.compile(r"^throttle-(\d+)-")


@dataclass
class BedrockServer:
    port: int
    attempts: Counter[str] = field(default_factory=Counter)
    #: The ``amz-sdk-request`` header of each request, in arrival order.
    sdk_requests: list[str] = field(default_factory=list)
    #: Requests served so far (their request ids are numbered from it).
    served: int = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _string_header(name: str, value: str) -> bytes:
    """One event-stream header of type 7 (string)."""
    raw_name, raw_value = name.encode(), value.encode()
    return (
        bytes([len(raw_name)]) + raw_name + b"\x07" + struct.pack(">H", len(raw_value)) + raw_value
    )


def event_message(event_type: str, payload: dict[str, Any]) -> bytes:
    """One AWS event-stream message: prelude (total length, headers length, CRC32), the
    ``:event-type``, ``:content-type`` and ``:message-type`` headers, a JSON payload, and the
    message's CRC32."""
    headers = (
        _string_header(":event-type", event_type)
        + _string_header(":content-type", "application/json")
        + _string_header(":message-type", "event")
    )
    body = json.dumps(payload).encode()
    total = 12 + len(headers) + len(body) + 4
    prelude = struct.pack(">II", total, len(headers))
    prelude += struct.pack(">I", binascii.crc32(prelude))
    message = prelude + headers + body
    return message + struct.pack(">I", binascii.crc32(message))


def converse_stream_events() -> list[bytes]:
    """ConverseStream's messages for TOKENS, in order."""
    events = [event_message("messageStart", {"role": "assistant"})]
    events += [
        event_message("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": token}})
        for token in TOKENS
    ]
    events += [
        event_message("contentBlockStop", {"contentBlockIndex": 0}),
        event_message("messageStop", {"stopReason": "end_turn"}),
        event_message(
            "metadata",
            {
                "usage": {
                    "inputTokens": INPUT_TOKENS,
                    "outputTokens": len(TOKENS),
                    "totalTokens": INPUT_TOKENS + len(TOKENS),
                },
                "metrics": {"latencyMs": INVOCATION_LATENCY_MS},
            },
        ),
    ]
    return events


def invoke_stream_events() -> list[bytes]:
    """InvokeModelWithResponseStream's ``chunk`` messages: one per token, each a base64
    JSON document as the model wrote it."""
    return [
        event_message("chunk", {"bytes": base64.b64encode(json.dumps(part).encode()).decode()})
        for part in invoke_stream_parts()
    ]


def invoke_stream_parts() -> list[dict[str, Any]]:
    """The JSON documents of InvokeModelWithResponseStream's chunks: the last carries
    ``amazon-bedrock-invocationMetrics``."""
    parts: list[dict[str, Any]] = [{"text": token} for token in TOKENS]
    parts[-1]["amazon-bedrock-invocationMetrics"] = INVOCATION_METRICS
    return parts


def _headers(server: BedrockServer, token_counts: bool = False) -> dict[str, str]:
    """The response headers; ``token_counts``: InvokeModel's, which count the tokens (a stream's
    headers cannot, and Converse counts them in its body)."""
    server.served += 1
    headers = {
        "x-amzn-requestid": f"req-bedrock-{server.served}",
        "x-amzn-bedrock-invocation-latency": str(INVOCATION_LATENCY_MS),
    }
    if token_counts:
        headers["x-amzn-bedrock-input-token-count"] = str(INPUT_TOKENS)
        headers["x-amzn-bedrock-output-token-count"] = str(len(TOKENS))
    return headers


async def _receive(request: web.Request) -> web.Response | None:
    """Record the request; then a scripted throttle, or the model's processing time."""
    server = request.app[SERVER]
    server.sdk_requests.append(request.headers.get("amz-sdk-request", ""))
    await request.read()
    model = request.match_info["model"]
    server.attempts[model] += 1
    throttle = _THROTTLE.match(model)
    if throttle is not None and server.attempts[model] <= int(throttle.group(1)):
        server.served += 1
        return web.json_response(
            {"message": "Too many requests, please wait before trying again."},
            status=429,
            headers={
                "x-amzn-requestid": f"req-bedrock-{server.served}",
                "x-amzn-ErrorType": "ThrottlingException:http://internal.amazon.com/coral/",
            },
        )
    await asyncio.sleep(WAIT)
    return None


async def _converse(request: web.Request) -> web.StreamResponse:
    if (failure := await _receive(request)) is not None:
        return failure
    return web.json_response(
        {
            "output": {"message": {"role": "assistant", "content": [{"text": "".join(TOKENS)}]}},
            "stopReason": "end_turn",
            "usage": {
                "inputTokens": INPUT_TOKENS,
                "outputTokens": len(TOKENS),
                "totalTokens": INPUT_TOKENS + len(TOKENS),
            },
            "metrics": {"latencyMs": INVOCATION_LATENCY_MS},
        },
        headers=_headers(request.app[SERVER]),
    )


async def _invoke(request: web.Request) -> web.StreamResponse:
    if (failure := await _receive(request)) is not None:
        return failure
    headers = _headers(request.app[SERVER], token_counts=True)
    return web.json_response({"text": "".join(TOKENS)}, headers=headers)


async def _stream(request: web.Request, events: list[bytes]) -> web.StreamResponse:
    if (failure := await _receive(request)) is not None:
        return failure
    headers = _headers(request.app[SERVER])
    headers["Content-Type"] = EVENT_STREAM
    headers["X-Amzn-Bedrock-Content-Type"] = "application/json"
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    for i, message in enumerate(events):
        if i:
            await asyncio.sleep(TOKEN_GAP)
        await response.write(message)
    await response.write_eof()
    return response


async def _converse_stream(request: web.Request) -> web.StreamResponse:
    return await _stream(request, converse_stream_events())


async def _invoke_stream(request: web.Request) -> web.StreamResponse:
    return await _stream(request, invoke_stream_events())


async def _retrieve(request: web.Request) -> web.StreamResponse:
    """bedrock-agent-runtime's Retrieve, from a knowledge base with nothing in it."""
    await request.read()
    await asyncio.sleep(WAIT)
    return web.json_response({"retrievalResults": []}, headers=_headers(request.app[SERVER]))


async def _head_bucket(request: web.Request) -> web.StreamResponse:
    return web.Response(headers={"x-amz-request-id": "s3-req-1"})


SERVER = web.AppKey("server", BedrockServer)


@contextlib.asynccontextmanager
async def bedrock_server() -> AsyncIterator[BedrockServer]:
    """The server on a free loopback port, for the length of the block."""
    server = BedrockServer(0)
    app = web.Application()
    app[SERVER] = server
    app.router.add_post("/model/{model}/converse", _converse)
    app.router.add_post("/model/{model}/converse-stream", _converse_stream)
    app.router.add_post("/model/{model}/invoke", _invoke)
    app.router.add_post("/model/{model}/invoke-with-response-stream", _invoke_stream)
    app.router.add_post("/knowledgebases/{kb}/retrieve", _retrieve)
    app.router.add_route("HEAD", "/{bucket}", _head_bucket)
    async with serving(app) as server.port:
        yield server
