"""Reading an answer's tokens from its body: each provider's usage as its API sends it, the first
generated content of a stream (never a control event), chunk edges anywhere, compressed bodies."""

from __future__ import annotations

import base64
import gzip
import json
import zlib
from typing import Any

import pytest

from llm_latency.tokens import EDGE_BYTES, BodyWatch
from llm_latency.usage import Usage, read_usage


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def watched(chunks: list[bytes], streamed: bool, encoding: str | None = None) -> BodyWatch:
    """A watch fed ``chunks`` as ``Timeline.chunk`` feeds it, chunk ``i`` arriving at ``i``."""
    watch = BodyWatch(streamed, encoding)
    for now, data in enumerate(chunks, start=1):
        watch.previous, watch.last = watch.last, data
        if watch.watching:
            watch.look(data, now)
    return watch


OPENAI_JSON = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * 9000}}],
        "usage": {
            "prompt_tokens": 1200,
            "completion_tokens": 300,
            "total_tokens": 1500,
            "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 64, "audio_tokens": 0},
        },
        "system_fingerprint": "fp_1",
    }
).encode()
ANTHROPIC_JSON = json.dumps(
    {
        "id": "msg_1",
        "type": "message",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "hi"}],
        "usage": {
            "input_tokens": 20,
            "cache_creation_input_tokens": 100,
            "cache_read_input_tokens": 2000,
            "output_tokens": 50,
        },
    }
).encode()
GEMINI_JSON = json.dumps(
    {
        "candidates": [{"content": {"parts": [{"text": "hi"}], "role": "model"}}],
        "usageMetadata": {
            "promptTokenCount": 40,
            "candidatesTokenCount": 10,
            "cachedContentTokenCount": 32,
            "thoughtsTokenCount": 90,
            "totalTokenCount": 140,
        },
        "modelVersion": "gemini-2.5-flash",
    },
    indent=1,  # Google's front end sends spaces after the colons
).encode()
OLLAMA_JSON = json.dumps(
    {
        "model": "llama3.2",
        "message": {"role": "assistant", "content": "hi"},
        "done": True,
        "prompt_eval_count": 26,
        "prompt_eval_duration": 130_000_000,
        "eval_count": 298,
        "eval_duration": 4_700_000_000,
    }
).encode()
GROQ_JSON = json.dumps(
    {
        "model": "llama-3.3-70b-versatile",
        "usage": {
            "queue_time": 0.05,
            "prompt_tokens": 18,
            "prompt_time": 0.002,
            "completion_tokens": 100,
            "completion_time": 0.3,
        },
    }
).encode()
COHERE_JSON = json.dumps(
    {
        "id": "c1",
        "message": {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
        "usage": {
            "billed_units": {"input_tokens": 5, "output_tokens": 7},
            "tokens": {"input_tokens": 71, "output_tokens": 7},
        },
    }
).encode()
BEDROCK_JSON = json.dumps(
    {
        "output": {"message": {"role": "assistant", "content": [{"text": "hi"}]}},
        "usage": {
            "inputTokens": 30,
            "outputTokens": 8,
            "cacheReadInputTokens": 500,
            "totalTokens": 538,
        },
    }
).encode()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            OPENAI_JSON,
            Usage(1200, 300, 1024, 64, model="gpt-4o-mini-2024-07-18"),
            id="openai (cached and reasoning inside the counts)",
        ),
        pytest.param(
            ANTHROPIC_JSON,
            Usage(2120, 50, 2000, None, model="claude-sonnet-4-5", cache_write_tokens=100),
            id="anthropic (cache reads and writes beside input_tokens, added)",
        ),
        pytest.param(
            GEMINI_JSON,
            Usage(40, 100, 32, 90, model="gemini-2.5-flash"),
            id="gemini (thoughts beside the candidates, added)",
        ),
        pytest.param(
            OLLAMA_JSON,
            Usage(26, 298, model="llama3.2", prefill_time=0.13, decode_time=4.7),
            id="ollama (its own prefill and decode times)",
        ),
        pytest.param(
            GROQ_JSON,
            Usage(
                18,
                100,
                model="llama-3.3-70b-versatile",
                queue_time=0.05,
                prefill_time=0.002,
                decode_time=0.3,
            ),
            id="groq (queue, prompt and completion times)",
        ),
        pytest.param(COHERE_JSON, Usage(71, 7), id="cohere (tokens, not billed units)"),
        pytest.param(BEDROCK_JSON, Usage(530, 8, 500), id="bedrock converse"),
    ],
)
def test_usage_of_a_json_answer(body: bytes, expected: Usage) -> None:
    # In chunks of 1 KiB, as a socket would hand a large body over: only the edges are kept.
    chunks = [body[i : i + 1024] for i in range(0, len(body), 1024)]
    assert read_usage(watched(chunks, streamed=False), {}) == expected


def test_nothing_said_is_nothing_recorded() -> None:
    body = json.dumps({"id": "x", "choices": [{"message": {"content": "hi"}}]}).encode()
    assert read_usage(watched([body], streamed=False), {}).empty
    assert read_usage(None, {}).empty


def test_headers_count_tokens_the_body_does_not() -> None:
    found = {
        "x-amzn-bedrock-input-token-count": ["12"],
        "x-amzn-bedrock-output-token-count": ["34"],
        "fireworks-prefill-queue-duration": ["0.25"],
        "fireworks-generation-queue-duration": ["0.05"],
        "fireworks-prefill-duration": ["0.1"],
        "x-litellm-overhead-duration-ms": ["7"],
    }
    usage = read_usage(watched([b'{"text":"hi"}'], streamed=False), found)
    assert (usage.input_tokens, usage.output_tokens) == (12, 34)
    assert usage.queue_time == pytest.approx(0.3)
    assert usage.prefill_time == pytest.approx(0.1)
    assert usage.gateway_overhead == pytest.approx(0.007)


def test_a_generated_string_that_quotes_a_usage_field_is_not_usage() -> None:
    body = json.dumps({"choices": [{"message": {"content": '{"completion_tokens": 99}'}}]})
    assert read_usage(watched([body.encode()], streamed=False), {}).output_tokens is None


# -- streams ---------------------------------------------------------------------------------

ROLE = {"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
OPENAI_STREAM = [
    sse({"model": "gpt-4o", **ROLE, "usage": None}),
    sse({"model": "gpt-4o", "choices": [{"delta": {"content": "Hel"}}], "usage": None}),
    sse({"model": "gpt-4o", "choices": [{"delta": {"content": "lo"}}], "usage": None}),
    sse({"model": "gpt-4o", "choices": [{"delta": {}, "finish_reason": "stop"}], "usage": None}),
    sse({"model": "gpt-4o", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}),
    b"data: [DONE]\n\n",
]
ANTHROPIC_STREAM = [
    sse(
        {
            "type": "message_start",
            "message": {
                "model": "claude-haiku-4-5",
                "content": [],
                "usage": {"input_tokens": 25, "cache_read_input_tokens": 0, "output_tokens": 1},
            },
        },
        "message_start",
    ),
    sse(
        {"type": "content_block_start", "content_block": {"type": "text", "text": ""}},
        "content_block_start",
    ),
    sse({"type": "ping"}, "ping"),
    sse({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Hi"}}),
    sse({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "!"}}),
    sse({"type": "content_block_stop"}, "content_block_stop"),
    sse({"type": "message_delta", "usage": {"output_tokens": 15}}, "message_delta"),
    sse({"type": "message_stop"}, "message_stop"),
]
RESPONSES_STREAM = [
    sse({"type": "response.created", "response": {"model": "o4-mini", "reasoning": {}}}),
    sse({"type": "response.output_item.added", "item": {"type": "reasoning", "summary": []}}),
    sse({"type": "response.reasoning_summary_text.delta", "delta": "Think"}),
    sse({"type": "response.output_text.delta", "delta": "Hi"}),
    sse(
        {
            "type": "response.completed",
            "response": {
                "usage": {
                    "input_tokens": 30,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": 80,
                    "output_tokens_details": {"reasoning_tokens": 64},
                }
            },
        }
    ),
]


@pytest.mark.parametrize(
    ("chunks", "first_token_at", "expected"),
    [
        pytest.param(OPENAI_STREAM, 2, Usage(9, 2, model="gpt-4o"), id="openai include_usage"),
        pytest.param(
            ANTHROPIC_STREAM,
            4,
            Usage(25, 15, 0, model="claude-haiku-4-5"),
            id="anthropic (message_delta is cumulative: the last, not a sum)",
        ),
        pytest.param(
            RESPONSES_STREAM, 3, Usage(30, 80, 0, 64, model="o4-mini"), id="responses (reasoning)"
        ),
    ],
)
def test_a_stream_first_token_and_usage(
    chunks: list[bytes], first_token_at: int, expected: Usage
) -> None:
    watch = watched(chunks, streamed=True)
    assert watch.first_token_ns == first_token_at
    assert read_usage(watch, {}) == expected


def test_control_events_and_empty_deltas_are_no_token() -> None:
    watch = watched(OPENAI_STREAM[:1] + ANTHROPIC_STREAM[:3] + RESPONSES_STREAM[:2], True)
    assert watch.first_token_ns == 0
    # A key quoted inside generated text is escaped: not a key.
    quoted = sse({"choices": [{"delta": {"content": ""}, "logprobs": '\\"text\\":\\"x'}]})
    assert watched([quoted], streamed=True).first_token_ns == 0


@pytest.mark.parametrize("cut", range(1, 80))
def test_the_first_token_is_the_chunk_that_completes_it(cut: int) -> None:
    """A content delta split at any byte: the first token arrives with the chunk that holds
    its key, its colon and the string's first character."""
    stream = OPENAI_STREAM[0] + OPENAI_STREAM[1]
    at = stream.index(b'"content": "Hel"') + len(b'"content": "H')
    pieces = [stream[:cut], stream[cut:]] if cut < len(stream) else [stream]
    watch = watched(pieces, streamed=True)
    assert watch.first_token_ns == (1 if cut >= at else 2)


def test_a_stream_without_usage_says_none() -> None:
    chunks = [c.replace(b', "usage": null', b"") for c in OPENAI_STREAM[:4]] + [OPENAI_STREAM[-1]]
    watch = watched(chunks, streamed=True)
    assert watch.first_token_ns == 2
    usage = read_usage(watch, {})
    assert usage.output_tokens is None and usage.input_tokens is None


def test_bedrock_invoke_stream_base64_payloads() -> None:
    def frame(payload: dict[str, Any]) -> bytes:
        encoded = base64.b64encode(json.dumps(payload).encode()).decode()
        return (
            b"\x00\x00\x00\x50....:event-type\x07\x00\x05chunk"
            + json.dumps({"bytes": encoded}).encode()
        )

    chunks = [
        frame({"type": "message_start", "message": {"usage": {"input_tokens": 3}}}),
        frame({"type": "content_block_delta", "delta": {"text": "Hi"}}),
        frame(
            {
                "type": "message_stop",
                "amazon-bedrock-invocationMetrics": {
                    "inputTokenCount": 3,
                    "outputTokenCount": 4,
                    "invocationLatency": 40,
                },
            }
        ),
    ]
    watch = watched(chunks, streamed=True)
    assert watch.first_token_ns == 2
    assert (read_usage(watch, {}).input_tokens, read_usage(watch, {}).output_tokens) == (3, 4)


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", lambda data: zlib.compress(data)[2:-4]),  # raw deflate, as some servers send
    ],
)
def test_a_compressed_answer_is_read_whole_once(encoding: str, compress: Any) -> None:
    packed = compress(OPENAI_JSON)
    chunks = [packed[i : i + 512] for i in range(0, len(packed), 512)]
    usage = read_usage(watched(chunks, streamed=False, encoding=encoding), {})
    assert (usage.input_tokens, usage.output_tokens) == (1200, 300)


def test_an_encoding_it_cannot_read_gives_no_usage() -> None:
    watch = watched([b"\x28\xb5\x2f\xfd garbage"], streamed=False, encoding="zstd")
    assert read_usage(watch, {}).empty
    huge = watched([b"\x1f\x8b" + b"\0" * (EDGE_BYTES * 300)], streamed=False, encoding="gzip")
    assert read_usage(huge, {}).empty  # past KEEP_COMPRESSED: not kept
