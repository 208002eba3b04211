"""Spans read back into attempts and backoffs: llm-latency's request span (one per attempt)
with its phase children, and its ``retry.backoff`` spans; the SDK's finished spans
(``ReadableSpan``) as :class:`~llm_latency.diagnosis.model.SpanRecord`\\ s."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from llm_latency import semconv
from llm_latency.diagnosis.model import (
    RATELIMIT_HEADERS,
    Attempt,
    Backoff,
    Phase,
    SpanRecord,
)
from llm_latency.headers import parse_number
from llm_latency.providers import REQUEST_ID_HEADERS
from llm_latency.timeline import PHASE_NAMES


def _first(value: Any) -> str | None:
    if isinstance(value, (tuple, list)):
        return str(value[0]) if value else None
    return None if value is None else str(value)


def _float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _int(value: Any) -> int | None:
    number = _float(value)
    return None if number is None else int(number)


def _bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


def _header(attributes: Mapping[str, Any], name: str) -> str | None:
    return _first(attributes.get(f"http.response.header.{name}"))


def children_by_parent(spans: Iterable[SpanRecord]) -> dict[str, list[SpanRecord]]:
    """Each span's children, by the parent's id."""
    children: dict[str, list[SpanRecord]] = {}
    for span in spans:
        if span.parent_id is not None:
            children.setdefault(span.parent_id, []).append(span)
    return children


def is_attempt(span: SpanRecord, children: Sequence[SpanRecord]) -> bool:
    """True for llm-latency's request span: a span of its scope with ``url.full`` (CLIENT, or
    INTERNAL under another instrumentation's CLIENT span for the same request). When the scope
    is not known, a span with ``url.full`` and phase ``children`` or llm-latency's attributes."""
    if semconv.URL_FULL not in span.attributes:
        return False
    if span.scope is not None:
        return span.scope == semconv.SCOPE_NAME
    return any(semconv.PHASE in child.attributes for child in children) or any(
        key.startswith("llm_latency.") for key in span.attributes
    )


def is_backoff(span: SpanRecord) -> bool:
    """True for a ``retry.backoff`` span."""
    return span.name == semconv.BACKOFF_SPAN and span.kind == "INTERNAL"


def to_attempt(span: SpanRecord, children: Sequence[SpanRecord]) -> Attempt:
    """The attempt a request span and its phase children describe."""
    attributes = span.attributes
    phases = []
    for child in children:
        name = str(child.attributes.get(semconv.PHASE, ""))
        if name in PHASE_NAMES:
            phases.append(
                Phase(
                    name,
                    (child.start_ns - span.start_ns) / 1e9,
                    (child.end_ns - child.start_ns) / 1e9,
                    _float(child.attributes.get(semconv.EVENT_LOOP_LAG)),
                    _float(child.attributes.get(semconv.EVENT_LOOP_DESCHEDULED)),
                )
            )
    phases.sort(key=lambda p: PHASE_NAMES.index(p.name))
    status = _int(attributes.get(semconv.HTTP_RESPONSE_STATUS_CODE))
    error = attributes.get(semconv.ERROR_TYPE)
    ratelimit = {
        name: value
        for name in RATELIMIT_HEADERS
        if (value := _header(attributes, name)) is not None
    }
    return Attempt(
        start_ns=span.start_ns,
        duration=(span.end_ns - span.start_ns) / 1e9,
        phases=tuple(phases),
        url=str(attributes.get(semconv.URL_FULL, "")),
        host=str(attributes.get(semconv.SERVER_ADDRESS, "")),
        method=str(attributes.get(semconv.HTTP_REQUEST_METHOD, "")),
        status=status,
        error=None if error is None or str(error) == str(status) else str(error),
        failed_phase=_first(attributes.get(semconv.FAILED_PHASE)),
        reused=_bool(attributes.get(semconv.CONNECTION_REUSED)),
        closed_by=_first(attributes.get(semconv.CONNECTION_CLOSED_BY)),
        request_id=next(
            (rid for name in REQUEST_ID_HEADERS if (rid := _header(attributes, name))), None
        ),
        server_processing=_float(attributes.get(semconv.SERVER_PROCESSING_TIME)),
        network_overhead=_float(attributes.get(semconv.NETWORK_OVERHEAD)),
        event_loop_lag=_float(attributes.get(semconv.EVENT_LOOP_LAG)),
        descheduled=_float(attributes.get(semconv.EVENT_LOOP_DESCHEDULED)),
        protocol=_first(attributes.get(semconv.NETWORK_PROTOCOL_VERSION)),
        time_to_first_chunk=_float(attributes.get(semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK)),
        client=_first(attributes.get(semconv.CLIENT)),
        stream_events=_int(attributes.get(semconv.STREAM_EVENTS)),
        stream_max_gap=_float(attributes.get(semconv.STREAM_MAX_GAP)),
        stream_mean_interval=_float(attributes.get(semconv.STREAM_MEAN_INTERVAL)),
        stream_chunk_rate=_float(attributes.get(semconv.STREAM_CHUNK_RATE)),
        resend_count=_int(attributes.get(semconv.HTTP_REQUEST_RESEND_COUNT)) or 0,
        ratelimit=ratelimit,
        trace_id=span.trace_id,
        span_id=span.span_id,
        probe=_first(attributes.get(semconv.PROBE_ENDPOINT)),
        probe_kind=_first(attributes.get(semconv.PROBE_KIND)),
        model=_first(attributes.get(semconv.GEN_AI_RESPONSE_MODEL)),
        input_tokens=_int(attributes.get(semconv.GEN_AI_USAGE_INPUT_TOKENS)),
        output_tokens=_int(attributes.get(semconv.GEN_AI_USAGE_OUTPUT_TOKENS)),
        cached_tokens=_int(attributes.get(semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS)),
        time_to_first_token=_float(attributes.get(semconv.TIME_TO_FIRST_TOKEN)),
        time_per_output_token=_float(attributes.get(semconv.TIME_PER_OUTPUT_TOKEN)),
        usage_unknown=attributes.get(semconv.USAGE_UNKNOWN) is True,
        server_time_per_output_token_max=_float(
            attributes.get(semconv.SERVER_TIME_PER_OUTPUT_TOKEN_MAX)
        ),
        server_queue=_float(attributes.get(semconv.SERVER_QUEUE_TIME)),
        server_prefill=_float(attributes.get(semconv.SERVER_PREFILL_TIME)),
        server_decode=_float(attributes.get(semconv.SERVER_DECODE_TIME)),
        retry_after=_retry_after(attributes),
        service=span.service,
    )


def _retry_after(attributes: Mapping[str, Any]) -> float | None:
    """The wait a refusal asked for (s): ``retry-after-ms``, else ``retry-after`` when it is a
    number of seconds (an HTTP date is read against the clock of the moment it was sent, which
    a trace read later does not have)."""
    milliseconds = parse_number(_header(attributes, "retry-after-ms"))
    if milliseconds is not None and milliseconds >= 0:
        return milliseconds / 1000.0
    seconds = parse_number(_header(attributes, "retry-after"))
    return None if seconds is None else max(seconds, 0.0)


def to_backoff(span: SpanRecord) -> Backoff:
    """The backoff a ``retry.backoff`` span describes."""
    reason = span.attributes.get(semconv.BACKOFF_REASON)
    return Backoff(
        start_ns=span.start_ns,
        duration=(span.end_ns - span.start_ns) / 1e9,
        reason=None if reason is None else str(reason),
        retry_after=_float(span.attributes.get(semconv.BACKOFF_RETRY_AFTER)),
    )


def from_readable_spans(spans: Iterable[Any]) -> list[SpanRecord]:
    """SpanRecords of the SDK's finished spans (``ReadableSpan``)."""
    records = []
    for span in spans:
        context = span.context
        if context is None:
            continue
        parent = span.parent
        scope = span.instrumentation_scope
        records.append(
            SpanRecord(
                trace_id=f"{context.trace_id:032x}",
                span_id=f"{context.span_id:016x}",
                parent_id=None if parent is None else f"{parent.span_id:016x}",
                name=span.name,
                kind=span.kind.name,
                start_ns=span.start_time or 0,
                end_ns=span.end_time or span.start_time or 0,
                attributes=dict(span.attributes or {}),
                scope=None if scope is None else scope.name,
                service=_service(span),
            )
        )
    return records


def _service(span: Any) -> str | None:
    """The ``service.name`` of a finished span's resource, when it has one."""
    resource = getattr(span, "resource", None)
    name = None if resource is None else (resource.attributes or {}).get("service.name")
    return None if name is None else str(name)
