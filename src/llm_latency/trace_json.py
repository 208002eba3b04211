"""The JSON of trace files, read into :class:`SpanRecord`\\ s: Jaeger's spans and OTLP's.

- **Jaeger**: what its query API answers and its UI saves (``{"data": [trace, ...]}``), a bare
  trace (``{"traceID", "spans", "processes"}``) or a list of traces. Times are microseconds;
  the span kind is the ``span.kind`` tag and the instrumentation scope ``otel.scope.name``
  (``otel.library.name`` before); tags are typed, and an OpenTelemetry array attribute (such
  as ``http.response.header.x-request-id``) arrives as a string tag holding the JSON array,
  which is how the OTLP to Jaeger translation writes it.
- **OTLP JSON**: what the Collector's file exporter writes, one ``{"resourceSpans": [...]}``
  object per line (or one object, or Jaeger's ``/api/v3`` answer ``{"result": {...}}``).
  Ids are hex (base64, as a generic protobuf JSON writer makes them, is read too), times are
  nanoseconds as strings, the kind an integer or its enum name.

Each span keeps the program that made it (``service.name``: OTLP's resource attribute, Jaeger's
process), so that the calls of several programs in one file are diagnosed apart.

Each problem with a file is one :class:`TraceFileError` whose message is one line. Which format
a file is, and its spans grouped into calls, is ``trace_files``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from llm_latency.diagnosis.records import SpanRecord

#: Jaeger tags that carry what OTLP keeps outside the attributes.
_KIND_TAG = "span.kind"
_SCOPE_TAGS = ("otel.scope.name", "otel.library.name")
_OTLP_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
#: The resource attribute that names the program (Jaeger: the span's process).
_SERVICE_NAME = "service.name"


class TraceFileError(ValueError):
    """A trace file that cannot be read or holds no llm-latency spans (a one-line message)."""


def _get(mapping: Mapping[str, Any], camel: str, snake: str) -> Any:
    """A field by its JSON name, or by its proto name (protobuf JSON readers accept both)."""
    return mapping.get(camel, mapping.get(snake))


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# -- OTLP JSON ----------------------------------------------------------------------------------


def is_otlp(document: Any) -> bool:
    """Whether ``document`` is OTLP JSON (``resourceSpans``, bare or in ``result``)."""
    if not isinstance(document, dict):
        return False
    if isinstance(document.get("result"), dict):  # Jaeger's /api/v3/traces answer
        document = document["result"]
    return isinstance(_get(document, "resourceSpans", "resource_spans"), list)


def otlp_spans(document: dict[str, Any], name: str) -> Iterator[SpanRecord]:
    """The spans of an OTLP JSON ``document`` of the file ``name``, each with its service."""
    if isinstance(document.get("result"), dict):
        document = document["result"]
    for resource_spans in _list(_get(document, "resourceSpans", "resource_spans")):
        resource_spans = _dict(resource_spans)
        resource = _otlp_attributes(_dict(resource_spans.get("resource")).get("attributes"))
        service = resource.get(_SERVICE_NAME)
        service = None if service is None else str(service)
        scopes = _get(resource_spans, "scopeSpans", "scope_spans")
        if scopes is None:  # OTLP before 0.15
            scopes = _get(
                resource_spans, "instrumentationLibrarySpans", "instrumentation_library_spans"
            )
        for scope_spans in _list(scopes):
            scope_spans = _dict(scope_spans)
            scope = _get(scope_spans, "scope", "scope")
            if scope is None:
                scope = _get(scope_spans, "instrumentationLibrary", "instrumentation_library")
            scope_name = _dict(scope).get("name") or None
            for span in _list(scope_spans.get("spans")):
                yield replace(_otlp_span(_dict(span), scope_name, name), service=service)


def _otlp_span(span: dict[str, Any], scope: str | None, name: str) -> SpanRecord:
    try:
        trace_id = _otlp_id(_get(span, "traceId", "trace_id"), 16)
        span_id = _otlp_id(_get(span, "spanId", "span_id"), 8)
        parent = _get(span, "parentSpanId", "parent_span_id")
        start = int(_get(span, "startTimeUnixNano", "start_time_unix_nano"))
        end = int(_get(span, "endTimeUnixNano", "end_time_unix_nano") or start)
    except (TypeError, ValueError) as exc:
        raise TraceFileError(f"{name}: an OTLP span without valid ids or times ({exc})") from None
    return SpanRecord(
        trace_id=trace_id,
        span_id=span_id,
        parent_id=_otlp_id(parent, 8) if parent else None,
        name=str(span.get("name", "")),
        kind=_otlp_kind(span.get("kind")),
        start_ns=start,
        end_ns=end,
        attributes=_otlp_attributes(span.get("attributes")),
        scope=scope,
    )


def _otlp_id(value: Any, size: int) -> str:
    """Hex, as OTLP JSON writes ids; or base64, as the generic protobuf JSON mapping does."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"id {value!r}")
    if len(value) == size * 2:
        int(value, 16)
        return value.lower()
    try:
        raw = base64.b64decode(value, validate=True)
    except binascii.Error:
        raise ValueError(f"id {value!r}") from None
    if len(raw) != size:
        raise ValueError(f"id {value!r}")
    return raw.hex()


def _otlp_kind(value: Any) -> str:
    if isinstance(value, int) and 0 <= value < len(_OTLP_KINDS):
        return _OTLP_KINDS[value]
    if isinstance(value, str):
        return value.upper().removeprefix("SPAN_KIND_") or "UNSPECIFIED"
    return "UNSPECIFIED"


def _otlp_attributes(items: Any) -> dict[str, Any]:
    return {
        str(item["key"]): _otlp_value(_dict(item.get("value")))
        for item in _list(items)
        if isinstance(item, dict) and "key" in item
    }


def _otlp_value(value: dict[str, Any]) -> Any:
    """An ``AnyValue``; a value that does not convert is kept as it was written."""
    for camel, snake, convert in _OTLP_SCALARS:
        if camel in value or snake in value:
            raw = _get(value, camel, snake)
            try:
                return convert(raw)
            except (TypeError, ValueError):
                return raw
    if "arrayValue" in value or "array_value" in value:
        array = _dict(_get(value, "arrayValue", "array_value"))
        return tuple(_otlp_value(_dict(v)) for v in _list(array.get("values")))
    if "kvlistValue" in value or "kvlist_value" in value:
        kvlist = _dict(_get(value, "kvlistValue", "kvlist_value"))
        return json.dumps(_otlp_attributes(kvlist.get("values")))
    return None


_OTLP_SCALARS: tuple[tuple[str, str, Any], ...] = (
    ("stringValue", "string_value", str),
    ("boolValue", "bool_value", bool),
    ("intValue", "int_value", int),  # a string in OTLP JSON
    ("doubleValue", "double_value", float),  # "NaN" and "Infinity" are strings
    ("bytesValue", "bytes_value", str),  # base64, kept as text
)


# -- Jaeger JSON --------------------------------------------------------------------------------


def _is_jaeger_trace(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("spans"), list)


def jaeger_traces(document: Any) -> list[dict[str, Any]] | None:
    """The traces of a Jaeger document (API answer, one trace, or a list), or None."""
    if isinstance(document, dict) and "data" in document:
        data = document["data"]
        if isinstance(data, list) and all(_is_jaeger_trace(t) for t in data):
            return data
        return None
    if _is_jaeger_trace(document):
        return [document]
    if isinstance(document, list) and document and all(_is_jaeger_trace(t) for t in document):
        return document
    return None


def jaeger_error(document: Any) -> str | None:
    """The first error of a Jaeger answer that has no trace (``"data": null``), if any."""
    if not isinstance(document, dict) or document.get("data"):
        return None
    errors = document.get("errors")
    if not isinstance(errors, list) or not errors:
        return None
    first = errors[0]
    if isinstance(first, dict):
        return " ".join(str(first[key]) for key in ("code", "msg") if first.get(key) is not None)
    return str(first)


def jaeger_spans(trace: dict[str, Any], name: str) -> Iterator[SpanRecord]:
    """The spans of one Jaeger ``trace`` of the file ``name``, each with its process's service."""
    processes = _dict(trace.get("processes"))
    for span in trace["spans"]:
        if not isinstance(span, dict):
            raise TraceFileError(f"{name}: a Jaeger span that is not an object")
        service = _dict(processes.get(str(span.get("processID")))).get("serviceName")
        record = _jaeger_span(span, name)
        yield record if service is None else replace(record, service=str(service))


def _jaeger_span(span: dict[str, Any], name: str) -> SpanRecord:
    try:
        trace_id = _jaeger_id(span["traceID"], 32)
        span_id = _jaeger_id(span["spanID"], 16)
        parent_id = _jaeger_parent(span, trace_id)
        start_us = int(span["startTime"])
        duration_us = int(span.get("duration") or 0)
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceFileError(
            f"{name}: a Jaeger span without valid ids or times ({type(exc).__name__}: {exc})"
        ) from None
    attributes = {}
    kind = "INTERNAL"  # the OTLP to Jaeger translation writes no span.kind for UNSPECIFIED
    scope = None
    for tag in _list(span.get("tags")):
        if not isinstance(tag, dict) or "key" not in tag:
            continue
        key = str(tag["key"])
        value = _jaeger_value(tag)
        if key == _KIND_TAG:
            kind = str(value).upper()
        elif key in _SCOPE_TAGS:
            scope = scope or str(value)
        else:
            attributes[key] = value
    return SpanRecord(
        trace_id=trace_id,
        span_id=span_id,
        parent_id=parent_id,
        name=str(span.get("operationName", "")),
        kind=kind,
        start_ns=start_us * 1000,
        end_ns=(start_us + duration_us) * 1000,
        attributes=attributes,
        scope=scope,
    )


def _jaeger_id(value: Any, width: int) -> str:
    """Jaeger writes a 64-bit trace id with 16 digits: ids are padded back to full width."""
    text = str(value).lower()
    int(text, 16)
    return text.rjust(width, "0")


def _jaeger_parent(span: dict[str, Any], trace_id: str) -> str | None:
    """The parent: the CHILD_OF reference in the same trace (FOLLOWS_FROM are links)."""
    parents = [
        ref
        for ref in _list(span.get("references"))
        if isinstance(ref, dict) and ref.get("refType") == "CHILD_OF" and "spanID" in ref
    ]
    same_trace = [r for r in parents if _jaeger_id(r.get("traceID", trace_id), 32) == trace_id]
    chosen = (same_trace or parents)[:1]
    if chosen:
        return _jaeger_id(chosen[0]["spanID"], 16)
    if span.get("parentSpanID"):  # Jaeger's older embedded-process model
        return _jaeger_id(span["parentSpanID"], 16)
    return None


def _jaeger_value(tag: Mapping[str, Any]) -> Any:
    """A typed tag's value; one that does not convert is kept as it was written."""
    value: Any = tag.get("value")
    kind = tag.get("type")
    try:
        if kind == "int64":  # a string past 2**53, so that JavaScript keeps every digit
            return int(value)
        if kind == "float64":
            return float(value)
    except (TypeError, ValueError):
        return value
    if kind == "bool" and isinstance(value, str):
        return value.lower() == "true"
    if isinstance(value, str):
        return _array_or_string(value)
    return value


def _array_or_string(value: str) -> Any:
    """An OpenTelemetry array attribute becomes a string tag holding its JSON: read it back."""
    if not (value.startswith("[") and value.endswith("]")):
        return value
    try:
        items = json.loads(value)
    except json.JSONDecodeError:
        return value
    if isinstance(items, list) and all(_is_scalar(item) for item in items):
        return tuple(items)
    return value


def _is_scalar(item: Any) -> bool:
    return isinstance(item, (str, bool, int)) or (isinstance(item, float) and math.isfinite(item))
