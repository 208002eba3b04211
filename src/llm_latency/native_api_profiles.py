"""The profiles of the providers with an HTTP API of their own (:mod:`llm_latency.provider_profiles`
lists every provider): Anthropic, Amazon Bedrock, Google Gemini, Mistral, Cohere and Ollama."""

from __future__ import annotations

from typing import Final

from llm_latency.openai_compatible_profiles import EVENT_STREAM, OPENAI_USAGE
from llm_latency.provider_schema import (
    AWS_EVENT_STREAM,
    CACHE_READ,
    CACHE_READ_BESIDE,
    CACHE_WRITE_BESIDE,
    CHAT,
    DECODE_NANOSECONDS,
    EMBEDDINGS,
    GENERATE_CONTENT,
    INPUT,
    MILLISECONDS,
    NDJSON,
    OUTPUT,
    PREFILL_NANOSECONDS,
    REASONING_BESIDE,
    SERVER_TIMING,
    TEXT_COMPLETION,
    ProviderProfile,
    Route,
)

ANTHROPIC: Final = ProviderProfile(
    # anthropic: _base_client.py, _response.py (request-id); API reference "Rate limits".
    name="Anthropic",
    genai_name="anthropic",
    hosts=("api.anthropic.com",),
    own_routes=True,
    routes=tuple(
        Route(rf"(?:^|/)v1/{path}/?$", f"/v1/{path}", operation)
        for path, operation in (
            ("messages", CHAT),
            ("messages/count_tokens", None),
            ("messages/batches", None),
            ("complete", TEXT_COMPLETION),
        )
    ),
    request_id_headers=("request-id",),
    ratelimit_remaining=(
        ("anthropic-ratelimit-requests-remaining", "requests"),
        ("anthropic-ratelimit-tokens-remaining", "tokens"),
        ("anthropic-ratelimit-input-tokens-remaining", "input_tokens"),
        ("anthropic-ratelimit-output-tokens-remaining", "output_tokens"),
    ),
    ratelimit_reset=(
        ("requests", "anthropic-ratelimit-requests-reset"),
        ("tokens", "anthropic-ratelimit-tokens-reset"),
        ("input_tokens", "anthropic-ratelimit-input-tokens-reset"),
        ("output_tokens", "anthropic-ratelimit-output-tokens-reset"),
    ),
    ratelimit_other=(
        "anthropic-ratelimit-requests-limit",
        "anthropic-ratelimit-tokens-limit",
    ),
    retry_count_header="x-stainless-retry-count",
    stream_types=EVENT_STREAM,
    # anthropic: types/usage.py and message_delta_usage.py (input_tokens counts the
    # prompt after the last cache breakpoint only; message_delta's usage is cumulative);
    # the gateway's upstream time includes the hop from Anthropic's edge to the model
    # servers, so it is a ceiling on the model's share, not the model's time alone.
    usage_fields=(
        ("input_tokens", INPUT),
        ("output_tokens", OUTPUT),
        ("cache_read_input_tokens", CACHE_READ_BESIDE),
        ("cache_creation_input_tokens", CACHE_WRITE_BESIDE),
    ),
    usage_at=("usage",),
    server_time_headers=(("x-envoy-upstream-service-time", MILLISECONDS),),
    content_keys=("text", "thinking", "partial_json"),
    # types/raw_content_block_start_event.py: a tool_use block's start names the tool (its
    # first input_json_delta is empty); redacted_thinking is reasoning sent whole.
    content_types=("tool_use", "server_tool_use", "mcp_tool_use", "redacted_thinking"),
)

BEDROCK: Final = ProviderProfile(
    # botocore: data/bedrock-runtime/*/service-2.json (routes; serialize.py percent-encodes
    # the "/" of an ARN model id, so [^/]+ holds; invoke-with-bidirectional-stream needs
    # HTTP/2 and handlers.py removes it), retries/standard.py and handlers.py
    # (amz-sdk-request), parsers.py (x-amzn-requestid, event streams). The invocation
    # latency and token counts are headers of Bedrock's responses, not in botocore's model.
    name="AWS Bedrock",
    genai_name="aws.bedrock",
    hosts=(".amazonaws.com",),
    own_routes=True,
    routes=tuple(
        # InvokeModel's body is the model's own API: its operation is not the path's.
        Route(rf"(?:^|/)model/[^/]+/{path}/?$", f"/model/{{modelId}}/{path}", operation)
        for path, operation in (
            ("converse", CHAT),
            ("converse-stream", CHAT),
            ("invoke", None),
            ("invoke-with-response-stream", None),
            ("count-tokens", None),
        )
    ),
    request_id_headers=("x-amzn-requestid",),
    server_time_headers=(("x-amzn-bedrock-invocation-latency", MILLISECONDS),),
    retry_count_header="amz-sdk-request",
    stream_types=(("application/vnd.amazon.eventstream", AWS_EVENT_STREAM),),
    usage_headers=(
        ("x-amzn-bedrock-input-token-count", INPUT),
        ("x-amzn-bedrock-output-token-count", OUTPUT),
        ("x-amzn-bedrock-cache-read-input-token-count", CACHE_READ_BESIDE),
        ("x-amzn-bedrock-cache-write-input-token-count", CACHE_WRITE_BESIDE),
    ),
    # Converse's usage (and its stream's metadata event); InvokeModel's streams end with
    # amazon-bedrock-invocationMetrics inside the last chunk's base64 "bytes".
    usage_fields=(
        ("inputTokens", INPUT),
        ("outputTokens", OUTPUT),
        ("cacheReadInputTokens", CACHE_READ_BESIDE),
        ("cacheWriteInputTokens", CACHE_WRITE_BESIDE),
        ("inputTokenCount", INPUT),
        ("outputTokenCount", OUTPUT),
        ("cacheReadInputTokenCount", CACHE_READ_BESIDE),
        ("cacheWriteInputTokenCount", CACHE_WRITE_BESIDE),
    ),
    usage_at=("usage", "amazon-bedrock-invocationMetrics"),
    content_keys=("text", "reasoningText", "input", "redactedContent"),
    # ConverseStream's contentBlockStart names the tool ("start": {"toolUse": {...}}), its
    # input follows in contentBlockDelta's toolUse.input (ContentBlockStart,
    # ToolUseBlockStart); InvokeModel's Claude streams are Anthropic's events.
    content_objects=("toolUse",),
)

GEMINI: Final = ProviderProfile(
    # google-genai: _api_client.py (the paths it builds; streams ask for "?alt=sse"; it
    # retries, with tenacity, only when given HttpRetryOptions, and sends no retry-count
    # header). Google's front end answers with "server-timing: gfet4t7; dur=<ms>" and no
    # request-id or rate-limit header (the id is the body's responseId; a 429's wait is in
    # its body's RetryInfo).
    name="Gemini and Vertex AI",
    genai_name="gcp.gemini",
    hosts=("generativelanguage.googleapis.com",),
    own_routes=True,
    routes=tuple(
        Route(
            rf"(?:^|/)(v1(?:beta|alpha)?\d*)/{where}models/[^/:]+:{method}/?$",
            rf"/\1/{template}models/{{model}}:{method}",
            operation,
        )
        for where, template in (
            ("", ""),
            (
                r"projects/[^/]+/locations/[^/]+/publishers/[^/]+/",
                "projects/{project}/locations/{location}/publishers/{publisher}/",
            ),
        )
        for method, operation in (
            ("generateContent", GENERATE_CONTENT),
            ("streamGenerateContent", GENERATE_CONTENT),
            ("countTokens", None),
            ("embedContent", EMBEDDINGS),
            ("batchEmbedContents", EMBEDDINGS),
            ("predict", None),
            ("rawPredict", None),
            ("streamRawPredict", None),
        )
    ),
    server_time_headers=(("server-timing", SERVER_TIMING),),
    stream_types=EVENT_STREAM,
    # google-genai: types.py GenerateContentResponseUsageMetadata (candidatesTokenCount
    # leaves out the thoughts, which are billed as output).
    usage_fields=(
        ("promptTokenCount", INPUT),
        ("candidatesTokenCount", OUTPUT),
        ("cachedContentTokenCount", CACHE_READ),
        ("thoughtsTokenCount", REASONING_BESIDE),
    ),
    usage_at=("usageMetadata",),
    content_keys=("text",),
    # types.py Part: a function call comes whole (function_call; on Vertex AI, with
    # streamed arguments, its first part holds the name), as do a server-side tool's call
    # (tool_call) and the code the code-execution tool runs (executable_code); camelCase
    # on the wire.
    content_objects=("functionCall", "toolCall", "executableCode"),
)

MISTRAL: Final = ProviderProfile(
    # mistralai: client/chat.py, fim.py, agents.py (routes; chat is OpenAI's route);
    # utils/retries.py retries with no header of its own. Mistral's API answers with
    # mistral-correlation-id (x-kong-request-id holds the same id), its gateway's
    # x-envoy-upstream-service-time and x-kong-upstream-latency (ms), and per-minute and
    # per-month x-ratelimit-*-req-minute / -tokens-minute / -tokens-month headers, with
    # no reset header.
    name="Mistral",
    genai_name="mistral_ai",
    hosts=("api.mistral.ai",),
    own_routes=True,
    routes=tuple(
        Route(rf"(?:^|/)v1/{path}/?$", f"/v1/{path}", operation)
        for path, operation in (
            ("fim/completions", TEXT_COMPLETION),
            ("agents/completions", None),
            ("conversations", None),
            ("ocr", None),
        )
    ),
    note="and OpenAI's (`/v1/chat/completions`, `/v1/embeddings`, ...)",
    request_id_headers=("mistral-correlation-id", "x-kong-request-id"),
    server_time_headers=(
        ("x-envoy-upstream-service-time", MILLISECONDS),
        ("x-kong-upstream-latency", MILLISECONDS),
    ),
    ratelimit_remaining=(
        ("x-ratelimit-remaining-req-minute", "requests"),
        ("x-ratelimit-remaining-tokens-minute", "tokens"),
        ("x-ratelimit-remaining-tokens-month", "tokens_month"),
    ),
    ratelimit_other=(
        "x-ratelimit-limit-req-minute",
        "x-ratelimit-limit-tokens-minute",
        "x-ratelimit-limit-tokens-month",
        "x-ratelimit-tokens-query-cost",
    ),
    stream_types=EVENT_STREAM,
    usage_fields=OPENAI_USAGE,
    usage_at=("usage",),
    content_keys=("content", "arguments"),
    # client/models/deltamessage.py, toolcall.py: a tool call comes whole, its arguments a
    # string or an object (FunctionCall.arguments).
    content_objects=("tool_calls",),
)

COHERE: Final = ProviderProfile(
    # cohere: v2/raw_client.py and raw_base_client.py (routes, streams: v2 is SSE, v1
    # "application/stream+json"); core/http_client.py retries (no retry-count header) and
    # waits as retry-after-ms, retry-after or x-ratelimit-reset say. Cohere's API answers
    # with x-debug-trace-id (no x-request-id), envoy's upstream time, and trial-key call
    # limits.
    name="Cohere",
    genai_name="cohere",
    hosts=("api.cohere.com", "api.cohere.ai"),
    own_routes=True,
    routes=tuple(
        Route(rf"(?:^|/)(v[12])/{path}/?$", rf"/\1/{path}", operation)
        for path, operation in (
            ("chat", CHAT),
            ("embed", EMBEDDINGS),
            ("rerank", None),
            ("generate", TEXT_COMPLETION),
            ("classify", None),
            ("tokenize", None),
        )
    ),
    request_id_headers=("x-debug-trace-id",),
    server_time_headers=(("x-envoy-upstream-service-time", MILLISECONDS),),
    ratelimit_remaining=(("x-trial-endpoint-call-remaining", "requests"),),
    ratelimit_other=(
        "x-endpoint-monthly-call-limit",
        "x-trial-endpoint-call-limit",
        "x-ratelimit-reset",
    ),
    stream_types=(*EVENT_STREAM, ("application/stream+json", NDJSON)),
    # cohere: v2/types/usage.py (billed_units, then tokens: the last one read wins).
    usage_fields=(("input_tokens", INPUT), ("output_tokens", OUTPUT)),
    usage_at=("usage",),
    content_keys=("text", "thinking", "tool_plan", "arguments"),
    # v2/types/v2chat_stream_response.py: tool-plan-delta writes the plan, tool-call-start
    # names the tool ("tool_calls": {...}, arguments "") before tool-call-delta's
    # arguments; v1's tool-calls-chunk streams "tool_call_delta", tool-calls-generation
    # the whole "tool_calls" list (types/chat_tool_calls_chunk_event.py).
    content_objects=("tool_calls", "tool_call_delta"),
)

OLLAMA: Final = ProviderProfile(
    # ollama: _client.py (routes); the server streams one JSON object per line.
    name="Ollama",
    genai_name="ollama",
    own_routes=True,
    routes=tuple(
        Route(rf"(?:^|/)api/{path}/?$", f"/api/{path}", operation)
        for path, operation in (
            ("chat", CHAT),
            ("generate", TEXT_COMPLETION),
            ("embed", EMBEDDINGS),
            ("embeddings", EMBEDDINGS),
        )
    ),
    stream_types=(("application/x-ndjson", NDJSON),),
    # ollama: _types.py (prompt_eval_count, eval_count, and their durations in ns: the
    # server's own prefill and decode times, on the last line of a stream).
    usage_fields=(
        ("prompt_eval_count", INPUT),
        ("eval_count", OUTPUT),
        ("prompt_eval_duration", PREFILL_NANOSECONDS),
        ("eval_duration", DECODE_NANOSECONDS),
    ),
    usage_at=("prompt_eval_count", "eval_count"),
    content_keys=("content", "thinking", "response"),
    # _types.py Message.tool_calls: each call whole, its arguments an object.
    content_objects=("tool_calls",),
)
