"""Span, attribute and metric names: the product's contract (docs/telemetry.md lists them,
tests/test_docs_tables.py checks the list).

Stable HTTP names come from ``opentelemetry-semantic-conventions``. The GenAI names are
written out here: that package documents its ``GEN_AI_*`` constants as deprecated (moved to the
GenAI conventions project), and a release without them must not break ``import llm_latency``
(tests/test_semconv.py checks the strings against the package while it still has them). The
``llm_latency.*`` names are this project's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

from opentelemetry.semconv._incubating.attributes.http_attributes import (
    HTTP_CONNECTION_STATE,
    HttpConnectionStateValues,
)
from opentelemetry.semconv._incubating.metrics.http_metrics import (
    HTTP_CLIENT_ACTIVE_REQUESTS,
    HTTP_CLIENT_CONNECTION_DURATION,
    HTTP_CLIENT_OPEN_CONNECTIONS,
)
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.semconv.attributes.http_attributes import (
    HTTP_REQUEST_METHOD,
    HTTP_REQUEST_METHOD_ORIGINAL,
    HTTP_REQUEST_RESEND_COUNT,
    HTTP_RESPONSE_STATUS_CODE,
)
from opentelemetry.semconv.attributes.network_attributes import (
    NETWORK_PEER_ADDRESS,
    NETWORK_PROTOCOL_VERSION,
)
from opentelemetry.semconv.attributes.server_attributes import SERVER_ADDRESS, SERVER_PORT
from opentelemetry.semconv.attributes.url_attributes import URL_FULL
from opentelemetry.semconv.metrics.http_metrics import HTTP_CLIENT_REQUEST_DURATION

from llm_latency.timeline import PHASE_NAMES

__all__ = [
    "ERROR_TYPE",
    "HTTP_CLIENT_ACTIVE_REQUESTS",
    "HTTP_CLIENT_CONNECTION_DURATION",
    "HTTP_CLIENT_OPEN_CONNECTIONS",
    "HTTP_CLIENT_REQUEST_DURATION",
    "HTTP_CONNECTION_STATE",
    "HTTP_REQUEST_METHOD",
    "HTTP_REQUEST_METHOD_ORIGINAL",
    "HTTP_REQUEST_RESEND_COUNT",
    "HTTP_RESPONSE_STATUS_CODE",
    "NETWORK_PEER_ADDRESS",
    "NETWORK_PROTOCOL_VERSION",
    "SERVER_ADDRESS",
    "SERVER_PORT",
    "URL_FULL",
    "HttpConnectionStateValues",
]

#: The instrumentation scope of every span and metric (dashboards filter on it).
SCOPE_NAME: Final = "llm_latency"
SCHEMA_URL: Final = "https://opentelemetry.io/schemas/1.37.0"

URL_TEMPLATE: Final = "url.template"

# -- GenAI (the strings of the GenAI semantic conventions) --------------------------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_REASONING_OUTPUT_TOKENS: Final = "gen_ai.usage.reasoning.output_tokens"
#: The old conventions' name of the prompt tokens written to the provider's cache (the released
#: ones call it ``cache_write``: :data:`GENAI_TABLE`).
GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: Final = "gen_ai.usage.cache_creation.input_tokens"
GEN_AI_TOKEN_TYPE: Final = "gen_ai.token.type"
#: ``gen_ai.token.type`` values.
GEN_AI_TOKEN_TYPE_INPUT: Final = "input"
GEN_AI_TOKEN_TYPE_OUTPUT: Final = "output"
GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK: Final = "gen_ai.client.operation.time_to_first_chunk"
GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK: Final = (
    "gen_ai.client.operation.time_per_output_chunk"
)
#: The token histogram of the conventions before semantic-conventions-genai v0.1.0, which
#: replaces it with counters and per-operation histograms (:data:`GENAI_TABLE`).
GEN_AI_CLIENT_TOKEN_USAGE: Final = "gen_ai.client.token.usage"

# -- tokens and the server's share (no GenAI name: llm-latency's own) --------------------------
#: True on a streamed answer that carried no usage (OpenAI without ``include_usage``).
USAGE_UNKNOWN: Final = "llm_latency.usage.unknown"
#: Request start to the first event carrying generated content (s).
TIME_TO_FIRST_TOKEN: Final = "llm_latency.time_to_first_token"
#: (stream end - first token) / (output tokens - 1), streamed answers (s).
TIME_PER_OUTPUT_TOKEN: Final = "llm_latency.time_per_output_token"
#: Server time / output tokens, answers not streamed: an upper bound (s).
SERVER_TIME_PER_OUTPUT_TOKEN_MAX: Final = "llm_latency.server.time_per_output_token_max"
SERVER_QUEUE_TIME: Final = "llm_latency.server.queue_time"
SERVER_PREFILL_TIME: Final = "llm_latency.server.prefill_time"
SERVER_DECODE_TIME: Final = "llm_latency.server.decode_time"
#: A gateway's own share of the server time (LiteLLM proxy's overhead header).
SERVER_GATEWAY_OVERHEAD: Final = "llm_latency.server.gateway_overhead"

PHASE: Final = "llm_latency.phase"
CONNECTION_REUSED: Final = "llm_latency.connection.reused"
#: The client's setting that closed the attempt's connection after it, so that the next request
#: opens one again: ``force_close=True`` (aiohttp's connector), ``Connection: close`` (a request
#: header), ``max_keepalive_connections=0`` (httpx's limits).
CONNECTION_CLOSED_BY: Final = "llm_latency.connection.closed_by"
#: The proxy an attempt went through: ``scheme://host:port``, never its credentials.
PROXY_URL: Final = "llm_latency.proxy.url"
SERVER_PROCESSING_TIME: Final = "llm_latency.server.processing_time"
NETWORK_OVERHEAD: Final = "llm_latency.network_overhead"
#: s, on the request span: the attempt's wait for a pooled connection (its ``http.queue``
#: phase), so that a collapsed trace view shows it.
QUEUE_TIME: Final = "llm_latency.queue_time"
#: The provider's request id as one string (the first of its profile's request id headers),
#: searchable as typed; the header's array attribute stays, as semconv spells it.
REQUEST_ID: Final = "llm_latency.request_id"
#: Span events on the request span (Jaeger draws each as a tick on its bar): where an attempt
#: that queued got its connection; on a streamed answer, its first response byte, first body
#: chunk and first generated token.
EVENT_CONNECTION_ACQUIRED: Final = "llm_latency.connection_acquired"
EVENT_FIRST_BYTE: Final = "llm_latency.first_byte"
EVENT_FIRST_CHUNK: Final = "llm_latency.first_chunk"
EVENT_FIRST_TOKEN: Final = "llm_latency.first_token"
EVENT_LOOP_LAG: Final = "llm_latency.event_loop.lag"
#: How long the event loop's thread waited for a CPU while the attempt was in flight (s): the
#: machine's share of the loop's lateness, left out of ``EVENT_LOOP_LAG``; on a phase span,
#: that phase's share.
EVENT_LOOP_DESCHEDULED: Final = "llm_latency.event_loop.descheduled"
#: The client library that made the attempt: aiohttp, httpx, httpx2 or urllib3 (requests).
CLIENT: Final = "llm_latency.client"
STREAM_EVENTS: Final = "llm_latency.stream.events"
STREAM_MAX_GAP: Final = "llm_latency.stream.max_gap"
STREAM_MEAN_INTERVAL: Final = "llm_latency.stream.mean_interval"
STREAM_CHUNK_RATE: Final = "llm_latency.stream.chunk_rate"
#: On the spans of ``llm-latency watch``'s probes: the endpoint's name and the probe kind.
PROBE_ENDPOINT: Final = "llm_latency.probe.endpoint"
PROBE_KIND: Final = "llm_latency.probe.kind"
FAILED_PHASE: Final = "llm_latency.failed_phase"
RATELIMIT_KIND: Final = "llm_latency.ratelimit.kind"
BACKOFF_REASON: Final = "llm_latency.backoff.reason"
BACKOFF_RETRY_AFTER: Final = "llm_latency.backoff.retry_after"
SDK: Final = "llm_latency.sdk"
ATTEMPTS: Final = "llm_latency.attempts"

BACKOFF_SPAN: Final = "retry.backoff"

#: Phase span names, indexed like ``timeline.PHASE_NAMES``.
PHASE_SPAN_NAMES: Final[tuple[str, ...]] = tuple("http." + name for name in PHASE_NAMES)

PHASE_DURATION: Final = "llm_latency.phase.duration"
RETRIES: Final = "llm_latency.retries"
RATE_LIMITED: Final = "llm_latency.rate_limited"
CONNECTIONS: Final = "llm_latency.connections"
RATELIMIT_REMAINING: Final = "llm_latency.ratelimit.remaining"
POOL_LIMIT: Final = "llm_latency.pool.limit"
POOL_WAITING: Final = "llm_latency.pool.waiting"

#: Histogram buckets (s) that reach LLM durations, not only the 10 s of the HTTP defaults.
DURATION_BUCKETS: Final[tuple[float, ...]] = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0,
)  # fmt: skip

#: Intervals between stream chunks (s): tokens come every few milliseconds, stalls last seconds.
CHUNK_INTERVAL_BUCKETS: Final[tuple[float, ...]] = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

#: Token counts: the GenAI conventions' advisory buckets for ``gen_ai.client.token.usage``.
TOKEN_USAGE_BUCKETS: Final[tuple[float, ...]] = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip

#: Time per output token (s): 1 ms (a small model on a fast server) to 1 s (a stalled one).
TOKEN_INTERVAL_BUCKETS: Final[tuple[float, ...]] = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5,
    1.0,
)  # fmt: skip

#: Connection lifetime buckets (s): from a connection closed after one request to hours of
#: keep-alive.
CONNECTION_DURATION_BUCKETS: Final[tuple[float, ...]] = (
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    7200.0,
)  # fmt: skip


# -- the GenAI conventions' released names (semantic-conventions-genai v0.1.0) ----------------

#: The variable of the official instrumentations' opt-in, and its GenAI values: the released
#: names instead of the old ones, or both (as the HTTP migration's ``http/dup``).
SEMCONV_STABILITY_OPT_IN: Final = "OTEL_SEMCONV_STABILITY_OPT_IN"
GEN_AI_LATEST_EXPERIMENTAL: Final = "gen_ai_latest_experimental"
GEN_AI_LATEST_EXPERIMENTAL_DUP: Final = "gen_ai_latest_experimental/dup"


class GenAINames(Enum):
    """Which GenAI names llm-latency emits (``settings.genai_names`` reads the opt-in once, at
    ``instrument()``)."""

    #: The names the official Python GenAI instrumentations still emit (the default).
    OLD = "old"
    #: semantic-conventions-genai v0.1.0's (``gen_ai_latest_experimental``).
    LATEST = "latest"
    #: Both (``gen_ai_latest_experimental/dup``).
    DUP = "dup"


GEN_AI_TOKEN_MODALITY: Final = "gen_ai.token.modality"
#: llm-latency reads no provider's per-modality breakdown: every count is ``unknown``.
GEN_AI_TOKEN_MODALITY_UNKNOWN: Final = "unknown"
GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS: Final = "gen_ai.usage.cache_write.input_tokens"
GEN_AI_CLIENT_INFERENCE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.client.inference.time_to_first_chunk"
GEN_AI_CLIENT_INFERENCE_TIME_PER_OUTPUT_CHUNK: Final = (
    "gen_ai.client.inference.time_per_output_chunk"
)
GEN_AI_CLIENT_INFERENCE_USAGE_INPUT_TOKENS: Final = "gen_ai.client.inference.usage.input_tokens"
GEN_AI_CLIENT_INFERENCE_USAGE_OUTPUT_TOKENS: Final = "gen_ai.client.inference.usage.output_tokens"
GEN_AI_CLIENT_INFERENCE_USAGE_CACHE_READ_INPUT_TOKENS: Final = (
    "gen_ai.client.inference.usage.cache_read.input_tokens"
)
GEN_AI_CLIENT_INFERENCE_USAGE_CACHE_WRITE_INPUT_TOKENS: Final = (
    "gen_ai.client.inference.usage.cache_write.input_tokens"
)
GEN_AI_CLIENT_INFERENCE_USAGE_REASONING_OUTPUT_TOKENS: Final = (
    "gen_ai.client.inference.usage.reasoning.output_tokens"
)
GEN_AI_CLIENT_INFERENCE_OPERATION_INPUT_TOKENS: Final = (
    "gen_ai.client.inference.operation.input_tokens"
)
GEN_AI_CLIENT_INFERENCE_OPERATION_OUTPUT_TOKENS: Final = (
    "gen_ai.client.inference.operation.output_tokens"
)

#: The released conventions' advice for their durations (s): 10 ms doubling to 81.92 s.
GENAI_DURATION_BUCKETS: Final[tuple[float, ...]] = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip


@dataclass(frozen=True)
class Instrument:
    """One GenAI instrument: its name, kind (``histogram`` or ``counter``), unit, buckets (a
    histogram's) and description."""

    name: str
    kind: str
    unit: str
    description: str
    buckets: tuple[float, ...] = ()


@dataclass(frozen=True)
class GenAIRow:
    """One GenAI concept and its names: ``old`` (the default's), ``latest`` (the opt-in's); None
    where that side has none. ``usage``: the :class:`~llm_latency.usage.Usage` field a token
    counter counts."""

    concept: str
    old: Instrument | str | None
    latest: Instrument | str | None
    usage: str = ""


_TOKENS: Final = "{token}"

#: Each GenAI concept llm-latency records, by its old and its released names: what
#: ``OTEL_SEMCONV_STABILITY_OPT_IN`` switches (docs/telemetry.md shows both names per row).
GENAI_TABLE: Final = (
    GenAIRow(
        "time to first chunk",
        Instrument(
            GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK,
            "histogram",
            "s",
            "Time from the start of a streamed request to its first body chunk.",
            DURATION_BUCKETS,
        ),
        Instrument(
            GEN_AI_CLIENT_INFERENCE_TIME_TO_FIRST_CHUNK,
            "histogram",
            "s",
            "Time from the start of a streamed request to its first body chunk.",
            GENAI_DURATION_BUCKETS,
        ),
    ),
    GenAIRow(
        "time per output chunk",
        Instrument(
            GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK,
            "histogram",
            "s",
            "Time between two body chunks of a streamed response, after the first (opt-in: one "
            "record per chunk).",
            CHUNK_INTERVAL_BUCKETS,
        ),
        Instrument(
            GEN_AI_CLIENT_INFERENCE_TIME_PER_OUTPUT_CHUNK,
            "histogram",
            "s",
            "Time between two body chunks of a streamed response, after the first (opt-in: one "
            "record per chunk).",
            GENAI_DURATION_BUCKETS,
        ),
    ),
    GenAIRow(
        "tokens per operation and type",
        Instrument(
            GEN_AI_CLIENT_TOKEN_USAGE,
            "histogram",
            _TOKENS,
            "Tokens of an LLM call as the server reported them, by type.",
            TOKEN_USAGE_BUCKETS,
        ),
        None,
    ),
    GenAIRow(
        "input tokens",
        None,
        Instrument(
            GEN_AI_CLIENT_INFERENCE_USAGE_INPUT_TOKENS,
            "counter",
            _TOKENS,
            "Input (prompt) tokens the servers reported, cached ones included.",
        ),
        "input_tokens",
    ),
    GenAIRow(
        "output tokens",
        None,
        Instrument(
            GEN_AI_CLIENT_INFERENCE_USAGE_OUTPUT_TOKENS,
            "counter",
            _TOKENS,
            "Output (completion) tokens the servers reported, reasoning ones included.",
        ),
        "output_tokens",
    ),
    GenAIRow(
        "cache read input tokens",
        None,
        Instrument(
            GEN_AI_CLIENT_INFERENCE_USAGE_CACHE_READ_INPUT_TOKENS,
            "counter",
            _TOKENS,
            "Input tokens served from the provider's cache.",
        ),
        "cache_read_tokens",
    ),
    GenAIRow(
        "cache write input tokens",
        None,
        Instrument(
            GEN_AI_CLIENT_INFERENCE_USAGE_CACHE_WRITE_INPUT_TOKENS,
            "counter",
            _TOKENS,
            "Input tokens written to the provider's cache.",
        ),
        "cache_write_tokens",
    ),
    GenAIRow(
        "reasoning output tokens",
        None,
        Instrument(
            GEN_AI_CLIENT_INFERENCE_USAGE_REASONING_OUTPUT_TOKENS,
            "counter",
            _TOKENS,
            "Output tokens the model spent reasoning.",
        ),
        "reasoning_tokens",
    ),
    GenAIRow(
        "input tokens per operation",
        None,
        Instrument(
            GEN_AI_CLIENT_INFERENCE_OPERATION_INPUT_TOKENS,
            "histogram",
            _TOKENS,
            "Input tokens per LLM call, as the server reported them.",
            TOKEN_USAGE_BUCKETS,
        ),
        "input_tokens",
    ),
    GenAIRow(
        "output tokens per operation",
        None,
        Instrument(
            GEN_AI_CLIENT_INFERENCE_OPERATION_OUTPUT_TOKENS,
            "histogram",
            _TOKENS,
            "Output tokens per LLM call, as the server reported them.",
            TOKEN_USAGE_BUCKETS,
        ),
        "output_tokens",
    ),
    # span and metric attributes
    GenAIRow("token type", GEN_AI_TOKEN_TYPE, GEN_AI_TOKEN_MODALITY),
    GenAIRow("operation name", None, GEN_AI_OPERATION_NAME),
    GenAIRow(
        "cache write tokens (span)",
        GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS,
        GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS,
    ),
)


def genai_row(concept: str) -> GenAIRow:
    """The row of :data:`GENAI_TABLE` for ``concept``."""
    (row,) = [row for row in GENAI_TABLE if row.concept == concept]
    return row
