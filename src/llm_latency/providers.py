"""What each LLM provider's HTTP API says about an attempt: one profile per provider.

A profile lists the provider's routes (they name the spans: ``POST /v1/chat/completions``), the
response headers that carry its request id, its own measure of the server's time, its
rate-limit state, the request header that numbers an SDK's retries, and the content types of
its streams. Everything else in llm-latency reads these through the tables built at the end of
this module, so adding a provider is adding one entry to :data:`PROFILES`.

Where each name comes from is noted beside it (the provider's SDK source or its API reference);
README's "Providers" table lists the same.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Final

#: Stream formats (``StreamFormat`` values) by the content types that carry them.
SSE: Final = "sse"
NDJSON: Final = "ndjson"
AWS_EVENT_STREAM: Final = "aws-eventstream"

#: How a server-time header reads: ``ms`` (a number of milliseconds), ``s`` (seconds), or
#: ``server-timing`` (the W3C ``Server-Timing`` list: the ``dur`` of its longest metric, ms).
MILLISECONDS: Final = "ms"
SECONDS: Final = "s"
SERVER_TIMING: Final = "server-timing"

#: What a usage field of a response body counts (``ProviderProfile.usage_fields``).
#: The whole prompt, cached tokens included (OpenAI's ``prompt_tokens``).
INPUT: Final = "input"
OUTPUT: Final = "output"
#: Cached prompt tokens counted inside ``input`` (OpenAI's ``cached_tokens``).
CACHE_READ: Final = "cache_read"
#: Cached prompt tokens reported beside ``input``, not in it (Anthropic, Bedrock): added to it.
CACHE_READ_BESIDE: Final = "cache_read_beside"
#: Prompt tokens written to the cache, reported beside ``input``: added to it.
CACHE_WRITE_BESIDE: Final = "cache_write_beside"
#: Reasoning tokens counted inside ``output`` (OpenAI's ``reasoning_tokens``).
REASONING: Final = "reasoning"
#: Reasoning tokens reported beside ``output`` (Gemini's ``thoughtsTokenCount``): added to it.
REASONING_BESIDE: Final = "reasoning_beside"
#: The server's own split of its time, in the unit the field names.
QUEUE_SECONDS: Final = "queue_s"
PREFILL_SECONDS: Final = "prefill_s"
DECODE_SECONDS: Final = "decode_s"
PREFILL_NANOSECONDS: Final = "prefill_ns"
DECODE_NANOSECONDS: Final = "decode_ns"

#: The parts of the server's time a header may name (``ProviderProfile.server_split_headers``).
QUEUE: Final = "queue"
PREFILL: Final = "prefill"
DECODE: Final = "decode"
#: A gateway's own overhead (LiteLLM proxy), inside the server time the client sees.
GATEWAY_OVERHEAD: Final = "gateway_overhead"

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


@dataclass(frozen=True)
class Route:
    """A path pattern and the ``url.template`` it reports. ``pattern`` is searched in the
    path (so a gateway's base path may come first); the template may refer to its groups
    (``\\1``), as :meth:`re.Match.expand` does."""

    pattern: str
    template: str


@dataclass(frozen=True)
class ProviderProfile:
    """One provider's API, as far as timing an attempt goes."""

    name: str
    routes: tuple[Route, ...] = ()
    #: Response headers whose value is the provider's id of the request, first found wins.
    request_id_headers: tuple[str, ...] = ()
    #: ``(header, how it reads)``: the provider's own measure of its time on the request.
    server_time_headers: tuple[tuple[str, str], ...] = ()
    #: Rate-limit "remaining" headers and the kind of budget each counts.
    ratelimit_remaining: tuple[tuple[str, str], ...] = ()
    #: The header that says when each kind's window resets (a duration, or a timestamp).
    ratelimit_reset: tuple[tuple[str, str], ...] = ()
    #: Other rate-limit headers worth keeping on the span (limits, per-window counts).
    ratelimit_other: tuple[str, ...] = ()
    #: The request header an SDK numbers its attempts with, if any.
    retry_count_header: str | None = None
    #: The content types of its streams and their format.
    stream_types: tuple[tuple[str, str], ...] = ()
    #: Other response headers worth keeping (model, region, ...).
    extra_headers: tuple[str, ...] = ()
    #: ``(JSON key, what it counts)``: the usage fields of its bodies and stream events, read
    #: from the body's first and last bytes (the kinds above: ``INPUT``, ``OUTPUT``, ...).
    usage_fields: tuple[tuple[str, str], ...] = ()
    #: The JSON keys the usage fields follow (``"usage"``, Gemini's ``"usageMetadata"``,
    #: Ollama's first count): where the search for them starts.
    usage_at: tuple[str, ...] = ()
    #: ``(header, what it counts)``: token counts sent as response headers.
    usage_headers: tuple[tuple[str, str], ...] = ()
    #: ``(header, part, how it reads)``: the server's own split of its time (``QUEUE``,
    #: ``PREFILL``, ``DECODE``, ``GATEWAY_OVERHEAD``); several headers of one part add up.
    server_split_headers: tuple[tuple[str, str, str], ...] = ()
    #: JSON keys whose non-empty string value is generated content in a stream event (text,
    #: reasoning, tool-call arguments): the first one seen is the first token.
    content_keys: tuple[str, ...] = ()
    #: ``gen_ai.provider.name`` (the GenAI conventions' well-known value where there is one).
    genai_name: str | None = None
    #: Host names (or ``.suffix``es) of the provider's own API: they name the provider.
    hosts: tuple[str, ...] = ()
    #: True when its routes are its own: a request to them names the provider on any host
    #: (OpenAI's routes are served by every compatible server, so they do not).
    own_routes: bool = False
    #: What the table cannot say (routes it shares with another profile, say).
    note: str = ""


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

# The OpenAI-compatible routes; a prefix such as Groq's "/openai" or a gateway's base path may
# come before "v1".
_OPENAI_ROUTES: Final = tuple(
    Route(rf"(?:^|/)v1/{path}/?$", f"/v1/{template}")
    for path, template in (
        ("chat/completions", "chat/completions"),
        ("completions", "completions"),
        ("responses", "responses"),
        ("responses/[^/]+", "responses/{response_id}"),
        ("embeddings", "embeddings"),
        ("moderations", "moderations"),
        ("models", "models"),
        ("audio/transcriptions", "audio/transcriptions"),
        ("audio/translations", "audio/translations"),
        ("audio/speech", "audio/speech"),
        ("images/generations", "images/generations"),
        ("batches", "batches"),
        ("rerank", "rerank"),
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
            )
            for path in (
                "chat/completions",
                "completions",
                "embeddings",
                "responses",
                "audio/transcriptions",
                "images/generations",
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
            Route(rf"(?:^|/)v1/{path}/?$", f"/v1/{path}")
            for path in ("messages", "messages/count_tokens", "messages/batches", "complete")
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
            Route(rf"(?:^|/)model/[^/]+/{path}/?$", f"/model/{{modelId}}/{path}")
            for path in (
                "converse",
                "converse-stream",
                "invoke",
                "invoke-with-response-stream",
                "count-tokens",
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
        content_keys=("text", "reasoningText", "input"),
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
            )
            for where, template in (
                ("", ""),
                (
                    r"projects/[^/]+/locations/[^/]+/publishers/[^/]+/",
                    "projects/{project}/locations/{location}/publishers/{publisher}/",
                ),
            )
            for method in (
                "generateContent",
                "streamGenerateContent",
                "countTokens",
                "embedContent",
                "batchEmbedContents",
                "predict",
                "rawPredict",
                "streamRawPredict",
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
            Route(rf"(?:^|/)v1/{path}/?$", f"/v1/{path}")
            for path in ("fim/completions", "agents/completions", "conversations", "ocr")
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
            Route(rf"(?:^|/)(v[12])/{path}/?$", rf"/\1/{path}")
            for path in ("chat", "embed", "rerank", "generate", "classify", "tokenize")
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
        content_keys=("text", "thinking"),
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
            Route(rf"(?:^|/)api/{path}/?$", f"/api/{path}")
            for path in ("chat", "generate", "embed", "embeddings")
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
            Route(r"(?:^|/)generate/?$", "/generate"),
            Route(r"(?:^|/)generate_stream/?$", "/generate_stream"),
            Route(r"(?:^|/)completion/?$", "/completion"),
            Route(r"(?:^|/)infill/?$", "/infill"),
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
        note="OpenAI's routes and SSE streams too",
    ),
)


def _unique(names: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


#: Every route, in profile order: the first that matches a path names it.
ROUTES: Final[tuple[tuple[re.Pattern[str], str], ...]] = tuple(
    (re.compile(route.pattern), route.template) for p in PROFILES for route in p.routes
)
#: ``gen_ai.provider.name`` of each route of :data:`ROUTES`, in the same order: the provider's
#: where the route is its own, else None.
ROUTE_OWNERS: Final[tuple[str | None, ...]] = tuple(
    p.genai_name if p.own_routes else None for p in PROFILES for _ in p.routes
)
REQUEST_ID_HEADERS: Final = _unique([h for p in PROFILES for h in p.request_id_headers])
SERVER_TIME_HEADERS: Final = tuple(
    dict.fromkeys(item for p in PROFILES for item in p.server_time_headers)
)
RATELIMIT_REMAINING_HEADERS: Final = dict(item for p in PROFILES for item in p.ratelimit_remaining)
#: Reset headers by ``(remaining header's kind, remaining header)``'s family: the reset header
#: of the same provider as the remaining header.
RATELIMIT_RESET_HEADERS: Final = {
    remaining: dict(p.ratelimit_reset).get(kind)
    for p in PROFILES
    for remaining, kind in p.ratelimit_remaining
}
RETRY_COUNT_HEADERS: Final = _unique(
    [p.retry_count_header for p in PROFILES if p.retry_count_header]
)
STREAM_TYPES: Final = dict(item for p in PROFILES for item in p.stream_types)
#: Usage body fields by JSON key. A key two providers share means the same there, except
#: ``input_tokens``: Anthropic's leaves the cached prompt out, which its beside-fields add back.
USAGE_FIELDS: Final = {key: kind for p in PROFILES for key, kind in p.usage_fields}
#: Where a body's usage fields start, any provider's: a usage object's key.
USAGE_AT: Final = _unique([key for p in PROFILES for key in p.usage_at])
USAGE_HEADERS: Final = tuple(dict.fromkeys(item for p in PROFILES for item in p.usage_headers))
SERVER_SPLIT_HEADERS: Final = tuple(
    dict.fromkeys(item for p in PROFILES for item in p.server_split_headers)
)
#: ``gen_ai.provider.name`` by host name.
PROVIDER_HOSTS: Final = tuple(
    (host, p.genai_name) for p in PROFILES if p.genai_name for host in p.hosts
)
#: The JSON keys whose non-empty string value is generated content, any provider's.
CONTENT_KEYS: Final = _unique([key for p in PROFILES for key in p.content_keys])
#: The response headers captured by default: all of the above, and the retry hints.
DEFAULT_RESPONSE_HEADERS: Final = _unique(
    [
        *REQUEST_ID_HEADERS,
        *(name for name, _ in SERVER_TIME_HEADERS),
        *(h for p in PROFILES for h in p.extra_headers),
        *(h for h, _ in USAGE_HEADERS),
        *(h for h, _, _ in SERVER_SPLIT_HEADERS),
        *(h for p in PROFILES for h in p.ratelimit_other),
        *RATELIMIT_REMAINING_HEADERS,
        *(h for h in RATELIMIT_RESET_HEADERS.values() if h),
        "retry-after",
        "retry-after-ms",
        "x-should-retry",
    ]
)


def provider_name(host: str, route_owner: str | None) -> str | None:
    """``gen_ai.provider.name`` of a request to ``host``: by the provider's own host, else by
    the owner of its route (:data:`ROUTE_OWNERS`); None when neither says (an
    OpenAI-compatible server on a host of its own)."""
    return _host_provider(host) or route_owner


@functools.lru_cache(maxsize=1024)
def _host_provider(host: str) -> str | None:
    """The provider whose own host ``host`` is (a walk over every profile's hosts: kept)."""
    host = host.lower()
    for name, genai_name in PROVIDER_HOSTS:
        if host == name or (name.startswith(".") and host.endswith(name)):
            return genai_name
    return None
