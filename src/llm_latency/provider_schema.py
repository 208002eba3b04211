"""What a provider profile is made of: :class:`ProviderProfile`, its :class:`Route`, and the
kinds of value its fields name (stream formats, how a server-time header reads, what a usage
field counts, the parts of the server's time).

The profiles themselves are :mod:`llm_latency.provider_profiles`; the tables everything else
reads, built from them, are :mod:`llm_latency.providers`.
"""

from __future__ import annotations

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


#: ``gen_ai.operation.name`` values (the GenAI conventions' well-known ones) a route names.
CHAT: Final = "chat"
TEXT_COMPLETION: Final = "text_completion"
EMBEDDINGS: Final = "embeddings"
GENERATE_CONTENT: Final = "generate_content"
FETCH_RESPONSE: Final = "fetch_response"


@dataclass(frozen=True)
class Route:
    """A path pattern and the ``url.template`` it reports. ``pattern`` is searched in the
    path (so a gateway's base path may come first); the template may refer to its groups
    (``\\1``), as :meth:`re.Match.expand` does. ``operation``: its ``gen_ai.operation.name``,
    where the route alone says it (None: not an inference, or not known from the path)."""

    pattern: str
    template: str
    operation: str | None = None


@dataclass(frozen=True)
class RouteFacts:
    """What a matched route says of an attempt beside its template: the provider that alone
    serves it (``gen_ai.provider.name``, None when it is shared) and its operation."""

    owner: str | None
    operation: str | None


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
    #: JSON keys whose value, a non-empty object or a list of objects, is generated content: a
    #: tool call sent whole (Gemini's ``functionCall``, Ollama's ``tool_calls``), or opened
    #: with its name before its arguments (OpenAI's first ``tool_calls`` delta, whose
    #: ``arguments`` is still ``""``). The model wrote the tool's name: the first token.
    content_objects: tuple[str, ...] = ()
    #: Values of a ``"type"`` key that open generated content: a content block or an output item
    #: that names the tool it calls (Anthropic's ``tool_use`` block, the Responses API's
    #: ``function_call`` item), sent before any argument.
    content_types: tuple[str, ...] = ()
    #: ``gen_ai.provider.name`` (the GenAI conventions' well-known value where there is one).
    genai_name: str | None = None
    #: Host names (or ``.suffix``es) of the provider's own API: they name the provider.
    hosts: tuple[str, ...] = ()
    #: True when its routes are its own: a request to them names the provider on any host
    #: (OpenAI's routes are served by every compatible server, so they do not).
    own_routes: bool = False
    #: What the table cannot say (routes it shares with another profile, say).
    note: str = ""
