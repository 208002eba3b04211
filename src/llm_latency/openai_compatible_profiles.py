"""The profiles of the providers that serve OpenAI's HTTP API (:mod:`llm_latency.provider_profiles`
lists every provider): OpenAI itself, Azure OpenAI, Groq, Fireworks, and the self-hosted servers
and gateways that speak it; and what they share (the usage fields, the rate-limit headers, the
routes), which some native APIs reuse."""

from __future__ import annotations

from typing import Final

from llm_latency.provider_schema import (
    CACHE_READ,
    CHAT,
    DECODE_SECONDS,
    EMBEDDINGS,
    FETCH_RESPONSE,
    GATEWAY_OVERHEAD,
    INPUT,
    MILLISECONDS,
    NDJSON,
    OUTPUT,
    PREFILL,
    PREFILL_SECONDS,
    QUEUE,
    QUEUE_SECONDS,
    REASONING,
    SECONDS,
    SSE,
    TEXT_COMPLETION,
    ProviderProfile,
    Route,
)

#: Usage fields every OpenAI-compatible API shares: chat completions (``prompt_tokens``, ...)
#: and the Responses API (``input_tokens``, ``output_tokens``, their details).
OPENAI_USAGE: Final = (
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
EVENT_STREAM: Final = (("text/event-stream", SSE),)
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


OPENAI: Final = ProviderProfile(
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
    stream_types=EVENT_STREAM,
    extra_headers=("openai-model",),
    # openai: types/completion_usage.py, types/responses/response_usage.py; the stream
    # events of chat completions (delta.content, delta.tool_calls[].function.arguments;
    # reasoning_content and reasoning from the compatible servers) and of the Responses
    # API (response.*.delta events carry "delta" as a string).
    usage_fields=OPENAI_USAGE,
    usage_at=("usage",),
    content_keys=("content", "reasoning_content", "reasoning", "arguments", "delta", "refusal"),
    # types/chat/chat_completion_chunk.py: a tool call's first delta names it with
    # "arguments": "" (ChoiceDeltaToolCall; function_call, its deprecated form); the
    # Responses API's response.output_item.added names the call its model makes, with its
    # arguments still empty (types/responses/response_output_item.py).
    content_objects=("tool_calls", "function_call"),
    content_types=_RESPONSES_CALLS,
)

AZURE_OPENAI: Final = ProviderProfile(
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
    stream_types=EVENT_STREAM,
    extra_headers=("x-ms-region",),
)

GROQ: Final = ProviderProfile(
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
    stream_types=EVENT_STREAM,
    extra_headers=("x-groq-region",),
    note="OpenAI's routes, under `/openai/v1`",
    # groq: types/completion_usage.py (queue_time, prompt_time, completion_time in s).
    usage_fields=(
        *OPENAI_USAGE,
        ("queue_time", QUEUE_SECONDS),
        ("prompt_time", PREFILL_SECONDS),
        ("completion_time", DECODE_SECONDS),
    ),
    usage_at=("usage",),
)

FIREWORKS: Final = ProviderProfile(
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
    stream_types=EVENT_STREAM,
    note="OpenAI's routes, under `/inference/v1`",
)

SELF_HOSTED: Final = ProviderProfile(
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
    usage_fields=OPENAI_USAGE,
    usage_at=("usage",),
    content_keys=("content", "reasoning_content", "reasoning", "arguments", "text"),
    content_objects=("tool_calls",),
    note="OpenAI's routes and SSE streams too",
)
