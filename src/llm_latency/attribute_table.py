"""The request span's attributes known at an attempt's end, from one table: which fact each
semconv name carries, and when it is kept.

Each row of :data:`END_ATTRIBUTES` and :data:`TOKEN_ATTRIBUTES` names an attribute, the dotted
path of its value from the attempt's :class:`~llm_latency.attempt_record.AttemptRecord` (its
``facts``, its ``timeline``, or the record's own fields) and when the value is kept; a usage's
fields are named by :data:`USAGE_ATTRIBUTES`. The functions are pure: plain values in, a dict
out, no OpenTelemetry and no state, so anything with the paths' attributes can be fed to them.
tests/test_docs_tables.py holds docs/telemetry.md's attribute tables to these rows.

Each table is read by a function made from its rows once, at import: the chain of ``if``
statements the rows spell, at that chain's cost per attempt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple

from llm_latency import semconv
from llm_latency.urls import proxy_origin

if TYPE_CHECKING:
    from llm_latency.attempt_record import AttemptRecord


class _Rule(Enum):
    NONZERO = "nonzero"


#: A row's value is kept when it is not None, and neither zero, empty nor False.
NONZERO: Final = _Rule.NONZERO
#: When a row's value is kept: ``None``, when it is not None; :data:`NONZERO`; or a function,
#: when it is not None, as the function makes it.
Keep = Callable[[Any], Any] | Literal[_Rule.NONZERO] | None


class Row(NamedTuple):
    """One attribute: its name, the dotted path of its value from the attempt's record, and
    when the value is kept."""

    attribute: str
    source: str
    keep: Keep = None


#: The request span's attributes known once its attempt has ended, in the order they are set
#: (the response headers come first: :func:`end_attributes`). A stream's events and longest gap
#: are set exactly when its first chunk's time is.
END_ATTRIBUTES: Final = (
    Row(semconv.HTTP_RESPONSE_STATUS_CODE, "facts.status"),
    Row(semconv.REQUEST_ID, "facts.request_id"),
    Row(semconv.QUEUE_TIME, "facts.queue_time"),
    Row(semconv.NETWORK_PROTOCOL_VERSION, "timeline.protocol_version", NONZERO),
    Row(semconv.CONNECTION_REUSED, "timeline.reused"),
    Row(semconv.CONNECTION_CLOSED_BY, "timeline.closed_by"),
    Row(semconv.NETWORK_PEER_ADDRESS, "timeline.peer_address"),
    Row(semconv.PROXY_URL, "timeline.proxy_url", proxy_origin),
    Row(semconv.HTTP_REQUEST_RESEND_COUNT, "resend_count", NONZERO),
    Row(semconv.EVENT_LOOP_LAG, "facts.event_loop_lag"),
    Row(semconv.EVENT_LOOP_DESCHEDULED, "facts.descheduled", NONZERO),
    Row(semconv.SERVER_PROCESSING_TIME, "facts.server_processing"),
    Row(semconv.NETWORK_OVERHEAD, "facts.network_overhead"),
    Row(semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, "facts.time_to_first_chunk"),
    Row(semconv.STREAM_EVENTS, "facts.stream_events"),
    Row(semconv.STREAM_MAX_GAP, "facts.stream_max_gap"),
    Row(semconv.STREAM_MEAN_INTERVAL, "facts.stream_mean_interval"),
    Row(semconv.STREAM_CHUNK_RATE, "facts.stream_chunk_rate"),
    Row(semconv.FAILED_PHASE, "facts.failed_phase"),
    Row(semconv.ERROR_TYPE, "facts.error_type"),
)

#: The span attribute of each field of a :class:`~llm_latency.usage.Usage`.
USAGE_ATTRIBUTES: Final = {
    "input_tokens": semconv.GEN_AI_USAGE_INPUT_TOKENS,
    "output_tokens": semconv.GEN_AI_USAGE_OUTPUT_TOKENS,
    "cache_read_tokens": semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    "reasoning_tokens": semconv.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS,
    "model": semconv.GEN_AI_RESPONSE_MODEL,
    "cache_write_tokens": semconv.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS,
    "queue_time": semconv.SERVER_QUEUE_TIME,
    "prefill_time": semconv.SERVER_PREFILL_TIME,
    "decode_time": semconv.SERVER_DECODE_TIME,
    "gateway_overhead": semconv.SERVER_GATEWAY_OVERHEAD,
}

#: The usage fields that say nothing at zero (OpenAI reports ``cached_tokens: 0`` and
#: ``reasoning_tokens: 0`` on every answer, Anthropic ``cache_creation_input_tokens: 0``): left
#: out then, as when not reported.
USAGE_SILENT_WHEN_ZERO: Final = frozenset(
    {"cache_read_tokens", "reasoning_tokens", "cache_write_tokens"}
)

#: The attributes of an attempt that carried an LLM answer beside its usage's
#: (:data:`USAGE_ATTRIBUTES`, first), in the order they are set.
TOKEN_ATTRIBUTES: Final = (
    Row(semconv.GEN_AI_PROVIDER_NAME, "provider"),
    Row(semconv.USAGE_UNKNOWN, "facts.usage_unknown", NONZERO),
    Row(semconv.TIME_TO_FIRST_TOKEN, "facts.time_to_first_token"),
    Row(semconv.TIME_PER_OUTPUT_TOKEN, "facts.time_per_output_token"),
    Row(semconv.SERVER_TIME_PER_OUTPUT_TOKEN_MAX, "facts.server_time_per_output_token_max"),
)


#: Adds a table's attributes of an attempt's record to a dict, in the table's order.
_Adder = Callable[[Any, dict[str, Any]], None]


def _adder(name: str, rows: Sequence[Row]) -> _Adder:
    """The function that adds ``rows``' attributes of a record to a dict: the chain of ``if``
    statements the rows spell, written once, at import. A loop over the rows read the same
    values at two to three times the cost per attempt (14 k instructions more with
    ``attrgetter``, 3 to 5 k with ``getattr`` or the facts' ``__dict__``): an attribute read
    whose name is only known at run time is not specialised by the interpreter."""
    lines = [f"def {name}(record, attributes):"]
    hoisted: set[str] = set()
    scope: dict[str, Any] = {}
    for index, row in enumerate(rows):
        path = row.source.split(".")
        assert all(part.isidentifier() for part in path), row
        if len(path) > 1 and path[0] not in hoisted:  # read each object of the record once
            hoisted.add(path[0])
            lines.append(f"    {path[0]}_ = record.{path[0]}")
        read = f"{path[0]}_.{'.'.join(path[1:])}" if len(path) > 1 else f"record.{path[0]}"
        scope[f"name{index}"] = row.attribute
        lines.append(f"    value = {read}")
        if row.keep is None:
            lines.append(f"    if value is not None:\n        attributes[name{index}] = value")
        elif row.keep is NONZERO:
            lines.append(f"    if value:\n        attributes[name{index}] = value")
        else:
            scope[f"keep{index}"] = row.keep
            lines.append(
                f"    if value is not None:\n        attributes[name{index}] = keep{index}(value)"
            )
    source = "\n".join(lines)
    exec(compile(source, f"<llm_latency.attribute_table {name}>", "exec"), scope)
    adder: _Adder = scope[name]
    adder.__doc__ = source  # what it does, for a reader in a debugger
    return adder


_add_end: Final = _adder("add_end_attributes", END_ATTRIBUTES)
_add_tokens: Final = _adder("add_token_attributes", TOKEN_ATTRIBUTES)


def end_attributes(record: AttemptRecord, header_names: Mapping[str, str]) -> dict[str, Any]:
    """The request span's attributes known once its attempt has ended (``record.facts`` set),
    each value as the SDK keeps it (a header's values in a tuple: see
    ``PhaseSpanWriter.set_attributes``). ``header_names``: the attribute of each captured
    response header."""
    attributes: dict[str, Any] = {}
    for name, values in record.facts.headers.items():
        attributes[header_names[name]] = tuple(values)
    _add_end(record, attributes)
    return attributes


def token_attributes(record: AttemptRecord) -> dict[str, Any]:
    """The GenAI and token attributes of an attempt that carried an LLM answer (``record.facts``
    set): on its request span, and on its logical call's span."""
    usage = record.facts.usage
    attributes: dict[str, Any] = (
        {}
        if usage is None
        else {
            USAGE_ATTRIBUTES[field]: value
            for field, value in vars(usage).items()
            if value is not None and (value or field not in USAGE_SILENT_WHEN_ZERO)
        }
    )
    _add_tokens(record, attributes)
    return attributes


def token_attributes_for(names: semconv.GenAINames) -> Callable[[AttemptRecord], dict[str, Any]]:
    """:func:`token_attributes` in the GenAI names ``names`` asks for (decided once, at
    ``instrument()``): the released conventions call the cache writes
    ``gen_ai.usage.cache_write.input_tokens`` (both names with ``/dup``), and name the route's
    operation (``gen_ai.operation.name``, where the route says it)."""
    if names is semconv.GenAINames.OLD:
        return token_attributes
    usage_names = {
        **USAGE_ATTRIBUTES,
        "cache_write_tokens": semconv.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS,
    }
    old_cache_write = (
        semconv.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS
        if names is semconv.GenAINames.DUP
        else None
    )

    def latest_token_attributes(record: AttemptRecord) -> dict[str, Any]:
        usage = record.facts.usage
        attributes: dict[str, Any] = {}
        if usage is not None:
            attributes = {
                usage_names[field]: value
                for field, value in vars(usage).items()
                if value is not None and (value or field not in USAGE_SILENT_WHEN_ZERO)
            }
            if old_cache_write is not None and usage.cache_write_tokens is not None:
                attributes[old_cache_write] = usage.cache_write_tokens
        route = record.route
        if route is not None and route.operation is not None:
            attributes[semconv.GEN_AI_OPERATION_NAME] = route.operation
        _add_tokens(record, attributes)
        return attributes

    return latest_token_attributes


def attribute_names() -> frozenset[str]:
    """Every attribute name the tables can set, in any GenAI names, but the captured
    headers'."""
    rows = (*END_ATTRIBUTES, *TOKEN_ATTRIBUTES)
    return frozenset(
        [row.attribute for row in rows]
        + list(USAGE_ATTRIBUTES.values())
        + [semconv.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS, semconv.GEN_AI_OPERATION_NAME]
    )
