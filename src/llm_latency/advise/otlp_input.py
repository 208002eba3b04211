"""An OTLP trace export request read into :class:`SpanRecord`\\ s: protobuf
(``application/x-protobuf``, what the Collector's ``otlp_http`` exporter and the SDK send by
default) or JSON (``application/json``, read by :mod:`llm_latency.trace_json` as a trace file),
or the message an OTLP/gRPC export carries (:func:`spans_of_message`).

Only what the diagnosis reads is kept of each span: its ids, name, kind, times, scope, service
and attributes. A request that does not parse is refused whole (:class:`BadRequest`), as the
OTLP specification asks: a 400, which the sender does not retry.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from llm_latency.diagnosis.records import SpanRecord
from llm_latency.trace_json import TraceFileError, otlp_spans

_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
#: The biggest request body read, once decompressed (the Collector's own default is 20 MiB).
MAX_BODY = 64 * 1024 * 1024


class BadRequest(ValueError):
    """A request that is not an OTLP trace export: its message says why, in one line."""


def decompress(body: bytes, encoding: str | None) -> bytes:
    """``body`` as sent with ``Content-Encoding: encoding`` (gzip, deflate or none)."""
    encoding = (encoding or "").strip().lower()
    windows = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
    if encoding in ("", "identity"):
        data = body
    elif encoding in windows:
        try:
            data = zlib.decompressobj(windows[encoding]).decompress(body, MAX_BODY + 1)
        except zlib.error as exc:
            raise BadRequest(f"cannot decompress the body: {exc}") from None
    else:
        raise BadRequest(f"unsupported Content-Encoding {encoding!r}")
    if len(data) > MAX_BODY:
        raise BadRequest(f"the body is larger than {MAX_BODY} bytes once decompressed")
    return data


def spans_of_request(body: bytes, content_type: str | None) -> list[SpanRecord]:
    """The spans of an export request's (decompressed) ``body``, by its ``content_type``."""
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind == "application/json":
        try:
            document = json.loads(body)
        except (UnicodeDecodeError, ValueError) as exc:
            raise BadRequest(f"the body is not JSON: {exc}") from None
        if not isinstance(document, dict):
            raise BadRequest("the body is not an OTLP JSON object")
        try:
            return list(otlp_spans(document, "the request"))
        except TraceFileError as exc:
            raise BadRequest(str(exc)) from None
    if kind in ("application/x-protobuf", "application/protobuf", ""):
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except DecodeError as exc:
            raise BadRequest(f"the body is not an OTLP protobuf request: {exc}") from None
        return spans_of_message(request)
    raise BadRequest(f"unsupported Content-Type {content_type!r}")


def spans_of_message(request: ExportTraceServiceRequest) -> list[SpanRecord]:
    """The spans of a parsed export request (protobuf, or received over gRPC)."""
    return list(_protobuf_spans(request))


def _protobuf_spans(request: ExportTraceServiceRequest) -> Iterator[SpanRecord]:
    for resource_spans in request.resource_spans:
        service = next(
            (
                str(_value(item.value))
                for item in resource_spans.resource.attributes
                if item.key == "service.name"
            ),
            None,
        )
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name or None
            for span in scope_spans.spans:
                if len(span.trace_id) != 16 or len(span.span_id) != 8:
                    raise BadRequest("a span without valid ids")
                start = span.start_time_unix_nano
                yield SpanRecord(
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_id=span.parent_span_id.hex() if span.parent_span_id else None,
                    name=span.name,
                    kind=_KINDS[span.kind] if 0 <= span.kind < len(_KINDS) else "UNSPECIFIED",
                    start_ns=start,
                    end_ns=span.end_time_unix_nano or start,
                    attributes=_attributes(span.attributes),
                    scope=scope,
                    service=service,
                )


def _attributes(items: Any) -> dict[str, Any]:
    pairs: list[KeyValue] = list(items)
    return {item.key: _value(item.value) for item in pairs}


def _value(value: AnyValue) -> Any:
    """An ``AnyValue`` as :mod:`llm_latency.trace_json` reads the same value from JSON."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return tuple(_value(each) for each in value.array_value.values)
    if which == "kvlist_value":
        return json.dumps({item.key: _value(item.value) for item in value.kvlist_value.values})
    if which == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, which)
