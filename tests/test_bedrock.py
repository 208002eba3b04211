"""Amazon Bedrock through the real boto3 client, against a loopback Bedrock-shaped server: the same
answer as openai and anthropic get. Each attempt is a request span with its phases, Bedrock's
request id and server time; each call a logical parent (``bedrock-runtime Converse``) that ends
when its stream does; botocore's throttling retries grouped under it with ``retry.backoff``
spans; and beside ``opentelemetry-instrumentation-botocore``, its GenAI span is the parent."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import boto3
import pytest
from botocore.config import Config
from dirty_equals import IsFloat, IsStr
from opentelemetry.instrumentation.botocore import BotocoreInstrumentor
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

import llm_latency
from tests.bedrock_api import (
    CONVERSE_STREAM_EVENTS,
    INPUT_TOKENS,
    INVOCATION_LATENCY_MS,
    TOKEN_GAP,
    TOKENS,
    WAIT,
    BedrockServer,
    bedrock_server,
    invoke_stream_parts,
)
from tests.checks import EARLY, OBSERVED_LATE
from tests.conftest import Telemetry, seconds
from tests.span_tree import phase_nodes, span_tree
from tests.test_retries import assert_attempts_and_waits, attrs, by_name, children

MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
#: An inference profile's ARN: botocore percent-encodes its "/" and ":" in the path.
PROFILE_ARN = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-v1:0"
MESSAGES = [{"role": "user", "content": [{"text": "hi"}]}]


@pytest.fixture
async def bedrock() -> AsyncIterator[BedrockServer]:
    async with bedrock_server() as server:
        yield server


def client(
    server: BedrockServer,
    service: str = "bedrock-runtime",
    mode: str = "standard",
    attempts: int = 4,
) -> Any:
    """A real boto3 client of ``service`` on the loopback server: fake credentials, a region,
    botocore's ``mode`` retries with at most ``attempts`` attempts per call."""
    session = boto3.session.Session(
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="fake-secret-key",
        region_name="us-east-1",
    )
    config = Config(
        retries={"mode": mode, "total_max_attempts": attempts},
        s3={"addressing_style": "path"},
    )
    return session.client(service, endpoint_url=server.endpoint, config=config)


def ours(telemetry: Telemetry) -> list[ReadableSpan]:
    """llm-latency's spans (not those of another instrumentation)."""
    return [
        s for s in telemetry.spans()
        if s.instrumentation_scope is not None and s.instrumentation_scope.name == "llm_latency"
    ]  # fmt: skip


def comparable(outcome: tuple[Any, ...]) -> tuple[Any, ...]:
    """An outcome without what differs from one request to the next (the request id, the
    date): a response's ResponseMetadata keeps its status and retry count."""
    if outcome[0] != "returned":
        return outcome
    response = dict(outcome[1])
    metadata = response.pop("ResponseMetadata")
    response["metadata"] = (metadata["HTTPStatusCode"], metadata["RetryAttempts"])
    return ("returned", response)


async def outcome(work: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        return ("returned", await asyncio.to_thread(work))
    except Exception as exc:
        return ("raised", type(exc).__qualname__, str(exc))


async def without_and_with(telemetry: Telemetry, work: Callable[[], Any]) -> tuple[Any, ...]:
    """Run ``work`` (a boto3 call, in a thread) without the plugin, then with it: it must
    return the same or raise the same. Returns the traced run's outcome."""
    llm_latency.uninstrument()
    bare = await outcome(work)
    assert ours(telemetry) == []
    telemetry.instrument()
    traced = await outcome(work)
    assert comparable(traced) == comparable(bare)
    telemetry.assert_all_ended_once()
    return traced


def returned(result: tuple[Any, ...]) -> dict[str, Any]:
    assert result[0] == "returned", result
    value: dict[str, Any] = result[1]
    return value


#: What an answer's spans say of its tokens: the server's own counts.
COUNTED = {
    "gen_ai.provider.name": "aws.bedrock",
    "gen_ai.usage.input_tokens": INPUT_TOKENS,
    "gen_ai.usage.output_tokens": len(TOKENS),
}
#: An answer not streamed: the server's time per output token is an upper bound.
ANSWERED = {
    **COUNTED,
    "llm_latency.server.time_per_output_token_max": pytest.approx(
        INVOCATION_LATENCY_MS / 1000 / len(TOKENS)
    ),
}
#: A stream read to its end: its first token and time per token, measured.
STREAMED = {
    **COUNTED,
    "llm_latency.time_to_first_token": IsFloat(ge=WAIT - EARLY),
    "llm_latency.time_per_output_token": IsFloat(ge=TOKEN_GAP - EARLY),
}


def the_call(
    telemetry: Telemetry, name: str, answer: dict[str, Any], attempts: int = 1
) -> ReadableSpan:
    """The one logical parent span llm-latency opened for the call: a root, INTERNAL, with the
    ``answer``'s token attributes (those of its attempt that answered)."""
    call = by_name(telemetry, name)
    assert call.parent is None
    assert call.kind is SpanKind.INTERNAL
    expected = {"llm_latency.sdk": "botocore", "llm_latency.attempts": attempts, **answer}
    # The request id of its last attempt that carried one, as one string.
    ids = [
        attrs(span)["http.response.header.x-amzn-requestid"][0]
        for span in sorted(telemetry.attempts(), key=lambda span: span.start_time or 0)
        if span.parent is not None
        and span.parent.span_id == call.context.span_id
        and "http.response.header.x-amzn-requestid" in attrs(span)
    ]
    if ids:
        expected["llm_latency.request_id"] = ids[-1]
    assert attrs(call) == expected
    return call


def assert_answer(attempt: ReadableSpan, answer: dict[str, Any]) -> None:
    """The attempt that answered carries the same token attributes as its call."""
    found = attrs(attempt)
    assert {name: found[name] for name in answer if name in found} == answer


def assert_attempt(
    telemetry: Telemetry, attempt: ReadableSpan, route: str, response: dict[str, Any]
) -> None:
    """A successful Bedrock attempt: named by its route, with the request id the program got,
    Bedrock's server time, and its phases (a new connection to an IP: no dns)."""
    assert attempt.name == f"POST /model/{{modelId}}/{route}"
    assert attempt.kind is SpanKind.CLIENT
    found = attrs(attempt)
    assert found["url.template"] == f"/model/{{modelId}}/{route}"
    assert found["http.response.status_code"] == 200
    request_id = response["ResponseMetadata"]["RequestId"]
    assert found["http.response.header.x-amzn-requestid"] == (request_id,)
    assert found["llm_latency.server.processing_time"] == pytest.approx(
        INVOCATION_LATENCY_MS / 1000
    )
    assert "http.request.resend_count" not in found
    phases = telemetry.phases(attempt)
    assert set(phases) == {"connect", "send", "wait", "receive"}
    assert seconds(phases["wait"]) >= WAIT - EARLY


def assert_stream(
    telemetry: Telemetry, call: ReadableSpan, attempt: ReadableSpan, events: int
) -> None:
    """A stream read to its end: first-chunk time, every event message counted, the receive
    phase spanning the gaps between them, and the call ending with the stream."""
    found = attrs(attempt)
    assert found["llm_latency.stream.events"] == events
    assert found["gen_ai.response.time_to_first_chunk"] >= WAIT - EARLY
    assert found["llm_latency.stream.max_gap"] > 0
    receive = telemetry.phases(attempt)["receive"]
    assert seconds(receive) >= (events - 1) * TOKEN_GAP - OBSERVED_LATE
    assert (call.end_time or 0) >= (attempt.end_time or 0)


# -- the four inference calls ---------------------------------------------------------------------


async def test_converse(telemetry: Telemetry, bedrock: BedrockServer) -> None:
    def work() -> Any:
        return client(bedrock).converse(modelId=MODEL, messages=MESSAGES)

    response = returned(await without_and_with(telemetry, work))
    assert response["output"]["message"]["content"] == [{"text": "".join(TOKENS)}]
    call = the_call(telemetry, "bedrock-runtime Converse", ANSWERED)
    (attempt,) = children(telemetry, call)
    assert_attempt(telemetry, attempt, "converse", response)
    assert_answer(attempt, ANSWERED)


async def test_converse_stream_read_to_the_end(
    telemetry: Telemetry, bedrock: BedrockServer
) -> None:
    def work() -> Any:
        response = client(bedrock).converse_stream(modelId=MODEL, messages=MESSAGES)
        return {**response, "stream": list(response["stream"])}

    response = returned(await without_and_with(telemetry, work))
    deltas = [
        e["contentBlockDelta"]["delta"]["text"]
        for e in response["stream"]
        if "contentBlockDelta" in e
    ]
    assert deltas == TOKENS
    call = the_call(telemetry, "bedrock-runtime ConverseStream", STREAMED)
    (attempt,) = children(telemetry, call)
    assert_attempt(telemetry, attempt, "converse-stream", response)
    assert_stream(telemetry, call, attempt, CONVERSE_STREAM_EVENTS)
    assert_answer(attempt, STREAMED)


async def test_converse_stream_closed_early(telemetry: Telemetry, bedrock: BedrockServer) -> None:
    def work() -> Any:
        response = client(bedrock).converse_stream(modelId=MODEL, messages=MESSAGES)
        stream = response["stream"]
        first = next(iter(stream))
        stream.close()
        return {**response, "stream": [first]}

    response = returned(await without_and_with(telemetry, work))
    assert response["stream"] == [{"messageStart": {"role": "assistant"}}]
    # without_and_with checked that every span ended, once: the attempt at the close, and the
    # call with it. Closed after messageStart: no token came, and no usage.
    call = the_call(telemetry, "bedrock-runtime ConverseStream", {})
    (attempt,) = children(telemetry, call)
    assert_attempt(telemetry, attempt, "converse-stream", response)
    assert 1 <= attrs(attempt)["llm_latency.stream.events"] < CONVERSE_STREAM_EVENTS
    assert (call.end_time or 0) >= (attempt.end_time or 0)


async def test_invoke_model(telemetry: Telemetry, bedrock: BedrockServer) -> None:
    def work() -> Any:
        response = client(bedrock).invoke_model(
            modelId=PROFILE_ARN, body=json.dumps({"prompt": "hi"})
        )
        return {**response, "body": json.loads(response["body"].read())}

    response = returned(await without_and_with(telemetry, work))
    assert response["body"] == {"text": "".join(TOKENS)}
    call = the_call(telemetry, "bedrock-runtime InvokeModel", ANSWERED)
    (attempt,) = children(telemetry, call)
    assert_attempt(telemetry, attempt, "invoke", response)
    assert_answer(attempt, ANSWERED)  # from the token-count headers
    # The body is read after invoke_model returned: the call lasts until then.
    assert (call.end_time or 0) >= (attempt.end_time or 0)


async def test_invoke_model_with_response_stream(
    telemetry: Telemetry, bedrock: BedrockServer
) -> None:
    def work() -> Any:
        response = client(bedrock).invoke_model_with_response_stream(
            modelId=MODEL, body=json.dumps({"prompt": "hi"})
        )
        return {**response, "body": [json.loads(e["chunk"]["bytes"]) for e in response["body"]]}

    response = returned(await without_and_with(telemetry, work))
    assert response["body"] == invoke_stream_parts()
    call = the_call(telemetry, "bedrock-runtime InvokeModelWithResponseStream", STREAMED)
    (attempt,) = children(telemetry, call)
    assert_attempt(telemetry, attempt, "invoke-with-response-stream", response)
    assert_stream(telemetry, call, attempt, len(TOKENS))
    # From the base64 payloads: the first token's, and the invocation metrics' counts.
    assert_answer(attempt, STREAMED)


# -- botocore's retries ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["standard", "adaptive", "legacy"])
async def test_throttling_retries_grouped_under_the_call(
    telemetry: Telemetry, bedrock: BedrockServer, mode: str
) -> None:
    # Two ThrottlingExceptions, then the answer; each run its own scenario.
    models = iter([f"throttle-2-{mode}-bare", f"throttle-2-{mode}-traced"])

    def work() -> Any:
        return client(bedrock, mode=mode).converse(modelId=next(models), messages=MESSAGES)

    response = returned(await without_and_with(telemetry, work))
    assert response["ResponseMetadata"]["RetryAttempts"] == 2
    call = the_call(telemetry, "bedrock-runtime Converse", ANSWERED, attempts=3)
    assert_attempts_and_waits(telemetry, call, ["429", "429"])

    def attempt(resend: int, answer: dict[str, Any]) -> dict[str, Any]:
        """An attempt of the call: the request, and what the server's ``answer`` adds."""
        return {
            "name": "POST /model/{modelId}/converse",
            "kind": "CLIENT",
            "attributes": {
                **({"http.request.resend_count": resend} if resend else {}),
                **answer,
                "http.request.method": "POST",
                "llm_latency.connection.reused": resend > 0,
                "network.peer.address": "127.0.0.1",
                "network.protocol.version": "1.1",
                "server.address": "127.0.0.1",
                "server.port": "PORT",
                "url.full": f"http://127.0.0.1:PORT/model/throttle-2-{mode}-traced/converse",
                "url.template": "/model/{modelId}/converse",
            },
            "children": phase_nodes(
                *(["connect"] if resend == 0 else []), "send", "wait", "receive"
            ),
        }

    throttled = {
        "error.type": "429",
        "http.response.header.x-amzn-requestid": [IsStr()],
        "http.response.status_code": 429,
        "llm_latency.request_id": IsStr(),
    }
    backoff = {"name": "retry.backoff", "kind": "INTERNAL",
               "attributes": {"llm_latency.backoff.reason": "429"}}  # fmt: skip
    answered = {
        **ANSWERED,
        "http.response.header.x-amzn-bedrock-invocation-latency": ["42"],
        "http.response.header.x-amzn-requestid": [response["ResponseMetadata"]["RequestId"]],
        "http.response.status_code": 200,
        "llm_latency.network_overhead": IsFloat(ge=0),
        "llm_latency.request_id": response["ResponseMetadata"]["RequestId"],
        "llm_latency.server.processing_time": 0.042,
    }
    # The call, and under it the attempts (a new request id each) and botocore's waits.
    assert span_tree(telemetry.spans()) == [
        {
            "name": "bedrock-runtime Converse",
            "kind": "INTERNAL",
            "attributes": {
                "llm_latency.attempts": 3,
                "llm_latency.request_id": response["ResponseMetadata"]["RequestId"],
                "llm_latency.sdk": "botocore",
                **ANSWERED,
            },
            "children": [
                attempt(0, throttled),
                backoff,
                attempt(1, throttled),
                backoff,
                attempt(2, answered),
            ],
        }
    ]
    ids = {attrs(s).get("http.response.header.x-amzn-requestid") for s in telemetry.requests()}
    assert len(ids) == 3


async def test_throttled_to_the_last_attempt(telemetry: Telemetry, bedrock: BedrockServer) -> None:
    models = iter(["throttle-5-bare", "throttle-5-traced"])

    def work() -> Any:
        return client(bedrock, attempts=2).converse(modelId=next(models), messages=MESSAGES)

    result = await without_and_with(telemetry, work)
    assert result[:2] == ("raised", "ThrottlingException")
    call = by_name(telemetry, "bedrock-runtime Converse")
    assert attrs(call)["llm_latency.attempts"] == 2
    assert attrs(call)["error.type"] == "ThrottlingException"
    assert call.status.status_code is StatusCode.ERROR
    assert_attempts_and_waits(telemetry, call, ["429"])


# -- other services, and other instrumentations ---------------------------------------------------


async def test_bedrock_agent_runtime_calls_get_a_parent(
    telemetry: Telemetry, bedrock: BedrockServer
) -> None:
    def work() -> Any:
        return client(bedrock, "bedrock-agent-runtime").retrieve(
            knowledgeBaseId="KB12345678", retrievalQuery={"text": "hi"}
        )

    response = returned(await without_and_with(telemetry, work))
    call = the_call(telemetry, "bedrock-agent-runtime Retrieve", {})
    (attempt,) = children(telemetry, call)
    request_id = response["ResponseMetadata"]["RequestId"]
    assert attrs(attempt)["http.response.header.x-amzn-requestid"] == (request_id,)


async def test_other_aws_services_get_no_parent(
    telemetry: Telemetry, bedrock: BedrockServer
) -> None:
    def work() -> Any:
        return client(bedrock, "s3").head_bucket(Bucket="bucket")

    await without_and_with(telemetry, work)
    (attempt,) = telemetry.attempts()
    assert attempt.name == "HEAD"
    assert attempt.parent is None
    phases = {s.context.span_id for s in telemetry.phases(attempt).values() if s.context}
    others = [
        s
        for s in ours(telemetry)
        if s is not attempt and s.context and s.context.span_id not in phases
    ]
    assert others == []


@pytest.fixture
def botocore_instrumentation(telemetry: Telemetry) -> Any:
    """``opentelemetry-instrumentation-botocore``, instrumented on top of llm-latency."""
    instrumentor = BotocoreInstrumentor()  # type: ignore[no-untyped-call]
    instrumentor.instrument(tracer_provider=telemetry.tracer_provider)
    try:
        yield instrumentor
    finally:
        instrumentor.uninstrument()


def genai_spans(telemetry: Telemetry) -> list[ReadableSpan]:
    return [s for s in telemetry.spans() if "gen_ai.system" in attrs(s)]


@pytest.mark.usefixtures("botocore_instrumentation")
async def test_under_the_botocore_instrumentations_genai_span(
    telemetry: Telemetry, bedrock: BedrockServer
) -> None:
    models = iter(["throttle-1-contrib-bare", "throttle-1-contrib-traced"])

    def work() -> Any:
        converse = client(bedrock).converse(modelId=next(models), messages=MESSAGES)
        streamed = client(bedrock).converse_stream(modelId=MODEL, messages=MESSAGES)
        return {**converse, "stream": list(streamed["stream"])}

    response = returned(await without_and_with(telemetry, work))
    assert response["ResponseMetadata"]["RetryAttempts"] == 1
    # The instrumentation's GenAI span of each call is the parent: llm-latency adds none.
    assert [s for s in telemetry.spans() if "llm_latency.sdk" in attrs(s)] == []
    chat, chat_stream = genai_spans(telemetry)[-2:]
    assert chat.instrumentation_scope is not None
    assert chat.instrumentation_scope.name.startswith("opentelemetry.instrumentation.botocore")
    assert attrs(chat)["gen_ai.system"] == "aws.bedrock"
    assert_attempts_and_waits(telemetry, chat, ["429"])
    (attempt,) = children(telemetry, chat_stream)
    assert attempt.name == "POST /model/{modelId}/converse-stream"
    assert attrs(attempt)["llm_latency.stream.events"] == CONVERSE_STREAM_EVENTS


@pytest.mark.usefixtures("botocore_instrumentation")
async def test_other_services_stay_suppressed_under_the_botocore_instrumentation(
    telemetry: Telemetry, bedrock: BedrockServer
) -> None:
    def work() -> Any:
        return client(bedrock, "s3").head_bucket(Bucket="bucket")

    await without_and_with(telemetry, work)
    assert ours(telemetry) == []
    assert [s.name for s in telemetry.spans()][-1:] == ["S3.HeadBucket"]


# -- hooking ---------------------------------------------------------------------------------------


def test_botocore_is_hooked_when_imported_and_unhooked_at_uninstrument() -> None:
    code = """
import sys
import llm_latency

llm_latency.instrument(configure=False)
assert "botocore" not in sys.modules, "instrument() imported botocore"
import botocore.client

hooked = vars(botocore.client.BaseClient)["_make_api_call"]
original = getattr(hooked, "__wrapped__", None)
assert original is not None, hooked
llm_latency.uninstrument()
assert vars(botocore.client.BaseClient)["_make_api_call"] is original
print("ok")
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
