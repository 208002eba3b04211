"""What each LLM provider's HTTP API says about an attempt: one profile per provider.

A profile lists the provider's routes (they name the spans: ``POST /v1/chat/completions``), the
response headers that carry its request id, its own measure of the server's time, its
rate-limit state, the request header that numbers an SDK's retries, and the content types of
its streams. Everything else in llm-latency reads these through the tables
:mod:`llm_latency.providers` builds from them, so adding a provider is adding one entry to
:data:`PROFILES`.

Where each name comes from is noted beside it (the provider's SDK source or its API reference);
README's "Providers" table lists the same.
"""

from __future__ import annotations

from typing import Final

from llm_latency.provider_schema import (
    AWS_EVENT_STREAM,
    CACHE_READ,
    CACHE_READ_BESIDE,
    CACHE_WRITE_BESIDE,
    CHAT,
    DECODE_NANOSECONDS,
    DECODE_SECONDS,
    EMBEDDINGS,
    FETCH_RESPONSE,
    GATEWAY_OVERHEAD,
    GENERATE_CONTENT,
    INPUT,
    MILLISECONDS,
    NDJSON,
    OUTPUT,
    PREFILL,
    PREFILL_NANOSECONDS,
    PREFILL_SECONDS,
    QUEUE,
    QUEUE_SECONDS,
    REASONING,
    REASONING_BESIDE,
    SECONDS,
    SERVER_TIMING,
    SSE,
    TEXT_COMPLETION,
    ProviderProfile,
    Route,
)

#: Usage fields every OpenAI-compatible API shares: chat completions (``prompt_tokens``, ...)
#: and the Responses API (``input_tokens``, ``output_tokens``, their details).
_OPENAI_USAGE: Final = (
    ("prompt_tokens", INPUT),
    ("completion_tokens", OUTPUT),
    ("input_tokens", INPUT),
    ("output_tokens", OUTPUT),
    ("cached_tokens", CACHE_READ),
    ("reasoning_tokens", REASONING),
)


_OPENAI_RATELIMITS: Final = (
    ("x-ratelimit-remaining-requests", "requests"),
    ("x-ratelimit-remaining-tokens", "tokens"),
)
_OPENAI_RESETS: Final = (
    ("requests", "x-ratelimit-reset-requests"),
    ("tokens", "x-ratelimit-reset-tokens"),
)
_OPENAI_LIMITS: Final = ("x-ratelimit-limit-requests", "x-ratelimit-limit-tokens")
_EVENT_STREAM: Final = (("text/event-stream", SSE),)
#: The Responses API's output items that are a call its model makes (types/responses/
#: response_output_item.py): not the server's own items (mcp_list_tools, the calls' outputs).
_RESPONSES_CALLS: Final = (
    "function_call",
    "custom_tool_call",
    "web_search_call",
    "file_search_call",
    "code_interpreter_call",
    "computer_call",
    "image_generation_call",
    "local_shell_call",
    "shell_call",
    "apply_patch_call",
    "tool_search_call",
    "mcp_call",
    "mcp_approval_request",
)

# The OpenAI-compatible routes; a prefix such as Groq's "/openai" or a gateway's base path may
# come before "v1". The operation (gen_ai.operation.name) where the route says it: the
# Responses API's create is a chat turn, its GET by id a fetch_response.
_OPENAI_ROUTES: Final = tuple(
    Route(rf"(?:^|/)v1/{path}/?$", f"/v1/{template}", operation)
    for path, template, operation in (
        ("chat/completions", "chat/completions", CHAT),
        ("completions", "completions", TEXT_COMPLETION),
        ("responses", "responses", CHAT),
        ("responses/[^/]+", "responses/{response_id}", FETCH_RESPONSE),
        ("embeddings", "embeddings", EMBEDDINGS),
        ("moderations", "moderations", None),
        ("models", "models", None),
        ("audio/transcriptions", "audio/transcriptions", None),
        ("audio/translations", "audio/translations", None),
        ("audio/speech", "audio/speech", None),
        ("images/generations", "images/generations", None),
        ("batches", "batches", None),
        ("rerank", "rerank", None),
    )
)

#: Known providers. Sources: each SDK's own source as installed from PyPI (named below), and the
#: providers' API references.
PROFILES: Final[tuple[ProviderProfile, ...]] = (
    ProviderProfile(
        # openai: _base_client.py (x-stainless-retry-count), _response.py (x-request-id);
        # API reference "Rate limits" and "Debugging requests" (openai-processing-ms).
        name="OpenAI",
        genai_name="openai",
        hosts=("api.openai.com",),
        routes=_OPENAI_ROUTES,
        request_id_headers=("x-request-id",),
        server_time_headers=(("openai-processing-ms", MILLISECONDS),),
        ratelimit_remaining=_OPENAI_RATELIMITS,
        ratelimit_reset=_OPENAI_RESETS,
        ratelimit_other=_OPENAI_LIMITS,
        retry_count_header="x-stainless-retry-count",
        stream_types=_EVENT_STREAM,
        extra_headers=("openai-model",),
        # openai: types/completion_usage.py, types/responses/response_usage.py; the stream
        # events of chat completions (delta.content, delta.tool_calls[].function.arguments;
        # reasoning_content and reasoning from the compatible servers) and of the Responses
        # API (response.*.delta events carry "delta" as a string).
        usage_fields=_OPENAI_USAGE,
        usage_at=("usage",),
        content_keys=("content", "reasoning_content", "reasoning", "arguments", "delta", "refusal"),
        # types/chat/chat_completion_chunk.py: a tool call's first delta names it with
        # "arguments": "" (ChoiceDeltaToolCall; function_call, its deprecated form); the
        # Responses API's response.output_item.added names the call its model makes, with its
        # arguments still empty (types/responses/response_output_item.py).
        content_objects=("tool_calls", "function_call"),
        content_types=_RESPONSES_CALLS,
    ),
    ProviderProfile(
        # Azure OpenAI REST reference: deployments routes, apim-request-id, x-ms-region.
        name="Azure OpenAI",
        genai_name="azure.ai.openai",
        hosts=(".openai.azure.com",),
        own_routes=True,
        routes=tuple(
            Route(
                rf"(?:^|/)openai/deployments/[^/]+/{path}/?$",
                f"/openai/deployments/{{deployment}}/{path}",
                operation,
            )
            for path, operation in (
                ("chat/completions", CHAT),
                ("completions", TEXT_COMPLETION),
                ("embeddings", EMBEDDINGS),
                ("responses", CHAT),
                ("audio/transcriptions", None),
                ("images/generations", None),
            )
        ),
        request_id_headers=("apim-request-id", "x-request-id"),
        server_time_headers=(("openai-processing-ms", MILLISECONDS),),
        ratelimit_remaining=_OPENAI_RATELIMITS,
        ratelimit_reset=_OPENAI_RESETS,
        ratelimit_other=_OPENAI_LIMITS,
        retry_count_header="x-stainless-retry-count",
        stream_types=_EVENT_STREAM,
        extra_headers=("x-ms-region",),
    ),
    ProviderProfile(
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
        stream_types=_EVENT_STREAM,
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
    ),
    ProviderProfile(
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
    ),
    ProviderProfile(
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
        stream_types=_EVENT_STREAM,
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
    ),
    ProviderProfile(
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
        stream_types=_EVENT_STREAM,
        usage_fields=_OPENAI_USAGE,
        usage_at=("usage",),
        content_keys=("content", "arguments"),
        # client/models/deltamessage.py, toolcall.py: a tool call comes whole, its arguments a
        # string or an object (FunctionCall.arguments).
        content_objects=("tool_calls",),
    ),
    ProviderProfile(
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
        stream_types=(*_EVENT_STREAM, ("application/stream+json", NDJSON)),
        # cohere: v2/types/usage.py (billed_units, then tokens: the last one read wins).
        usage_fields=(("input_tokens", INPUT), ("output_tokens", OUTPUT)),
        usage_at=("usage",),
        content_keys=("text", "thinking", "tool_plan", "arguments"),
        # v2/types/v2chat_stream_response.py: tool-plan-delta writes the plan, tool-call-start
        # names the tool ("tool_calls": {...}, arguments "") before tool-call-delta's
        # arguments; v1's tool-calls-chunk streams "tool_call_delta", tool-calls-generation
        # the whole "tool_calls" list (types/chat_tool_calls_chunk_event.py).
        content_objects=("tool_calls", "tool_call_delta"),
    ),
    ProviderProfile(
        # groq: the OpenAI-compatible API under /openai/v1 (openai's routes match it);
        # _base_client.py (x-stainless-retry-count); API reference "Rate limits" (the OpenAI
        # x-ratelimit-* names, reset as "2m59.56s", retry-after on a 429); x-groq-region.
        name="Groq",
        genai_name="groq",
        hosts=("api.groq.com",),
        request_id_headers=("x-request-id",),
        ratelimit_remaining=_OPENAI_RATELIMITS,
        ratelimit_reset=_OPENAI_RESETS,
        ratelimit_other=_OPENAI_LIMITS,
        retry_count_header="x-stainless-retry-count",
        stream_types=_EVENT_STREAM,
        extra_headers=("x-groq-region",),
        note="OpenAI's routes, under `/openai/v1`",
        # groq: types/completion_usage.py (queue_time, prompt_time, completion_time in s).
        usage_fields=(
            *_OPENAI_USAGE,
            ("queue_time", QUEUE_SECONDS),
            ("prompt_time", PREFILL_SECONDS),
            ("completion_time", DECODE_SECONDS),
        ),
        usage_at=("usage",),
    ),
    ProviderProfile(
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
    ),
    ProviderProfile(
        # Fireworks serves OpenAI's routes under /inference/v1 and answers with its own split
        # of the server's time, in seconds ("fireworks-prefill-queue-duration: 0.25"), and its
        # prompt token counts.
        name="Fireworks",
        genai_name="fireworks",
        hosts=("api.fireworks.ai",),
        usage_headers=(
            ("fireworks-prompt-tokens", INPUT),
            ("fireworks-cached-prompt-tokens", CACHE_READ),
        ),
        server_split_headers=(
            ("fireworks-prefill-queue-duration", QUEUE, SECONDS),
            ("fireworks-generation-queue-duration", QUEUE, SECONDS),
            ("fireworks-prefill-duration", PREFILL, SECONDS),
        ),
        stream_types=_EVENT_STREAM,
        note="OpenAI's routes, under `/inference/v1`",
    ),
    ProviderProfile(
        # vLLM and llama.cpp serve the OpenAI routes (llama.cpp also /completion); TGI serves
        # /generate, /generate_stream and the OpenAI chat route, and times each request
        # (x-total-time, ms); the LiteLLM proxy sends x-litellm-call-id and its own duration.
        name="OpenAI-compatible servers",
        routes=(
            Route(r"(?:^|/)generate/?$", "/generate", TEXT_COMPLETION),
            Route(r"(?:^|/)generate_stream/?$", "/generate_stream", TEXT_COMPLETION),
            Route(r"(?:^|/)completion/?$", "/completion", TEXT_COMPLETION),
            Route(r"(?:^|/)infill/?$", "/infill", TEXT_COMPLETION),
        ),
        request_id_headers=("x-litellm-call-id",),
        server_time_headers=(
            ("x-litellm-response-duration-ms", MILLISECONDS),
            ("x-total-time", MILLISECONDS),
            ("x-envoy-upstream-service-time", MILLISECONDS),
        ),
        stream_types=(("application/jsonl", NDJSON), ("application/json-seq", NDJSON)),
        extra_headers=("x-litellm-model-api-base",),
        # LiteLLM proxy: its overhead inside x-litellm-response-duration-ms; the upstream
        # provider's own headers come forwarded as llm_provider-<name>.
        server_split_headers=(("x-litellm-overhead-duration-ms", GATEWAY_OVERHEAD, MILLISECONDS),),
        usage_fields=_OPENAI_USAGE,
        usage_at=("usage",),
        content_keys=("content", "reasoning_content", "reasoning", "arguments", "text"),
        content_objects=("tool_calls",),
        note="OpenAI's routes and SSE streams too",
    ),
)
