"""Finished spans written the way the tools that store traces write them.

- OTLP JSON, as the Collector's file exporter writes it (one ``TracesData`` object a line):
  the real OTLP encoder (``encode_spans``), then protobuf's JSON mapping, with the two changes
  the OTLP JSON encoding makes to that mapping: trace and span ids in hex (not base64) and
  enums as integers (https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding; the
  specification's file exporter examples write ``"code":2``, lowerCamelCase field names and
  hex ids the same way).
- Jaeger's JSON, as its query API answers ``/api/traces/{id}`` and its UI saves it: no Jaeger
  runs here (no Docker, no Go toolchain), so the spans are converted by its documented model,
  as Jaeger's OTLP translator (opentelemetry-collector-contrib ``pkg/translator/jaeger``) and
  its UI model (``internal/uimodel``, ``converter/v1/json/from_domain.go``) do it: ids in hex,
  times in microseconds, the kind as the tag ``span.kind`` (lowercase), the scope as
  ``otel.scope.name``, attributes as typed tags, and an array attribute as a string tag holding
  its JSON (pcommon's ``Value.AsString``), the parent as a ``CHILD_OF`` reference.
  tests/data/ holds real samples of Jaeger's JSON, read by tests/test_explain.py too.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from google.protobuf.json_format import MessageToJson
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode


def otlp_document(spans: Sequence[ReadableSpan], hex_ids: bool = True) -> dict[str, Any]:
    """One export batch as OTLP JSON (``hex_ids=False``: the plain protobuf JSON mapping,
    base64 ids and enum names, as a generic protobuf JSON writer makes it)."""
    request = encode_spans(spans)
    document: dict[str, Any] = json.loads(
        MessageToJson(request, indent=None, use_integers_for_enums=hex_ids)
    )
    if hex_ids:
        for resource_spans in document["resourceSpans"]:
            for scope_spans in resource_spans["scopeSpans"]:
                for span in scope_spans["spans"]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in span:
                            span[key] = base64.b64decode(span[key]).hex()
    return document


def otlp_json_lines(batches: Sequence[Sequence[ReadableSpan]], hex_ids: bool = True) -> str:
    """A file exporter's file: one OTLP JSON object a line, one line per export batch."""
    return "".join(
        json.dumps(otlp_document(batch, hex_ids), separators=(",", ":")) + "\n" for batch in batches
    )


def _jaeger_tag(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):
        return {"key": key, "type": "int64", "value": value}
    if isinstance(value, float):
        return {"key": key, "type": "float64", "value": value}
    if isinstance(value, (tuple, list)):  # Go's json.Marshal of the slice: compact
        return {
            "key": key,
            "type": "string",
            "value": json.dumps(list(value), separators=(",", ":")),
        }
    return {"key": key, "type": "string", "value": str(value)}


def _jaeger_span(span: ReadableSpan) -> dict[str, Any]:
    assert span.context is not None and span.start_time is not None
    assert span.end_time is not None
    trace_id = f"{span.context.trace_id:032x}"
    tags = []
    if span.instrumentation_scope is not None:
        tags.append(_jaeger_tag("otel.scope.name", span.instrumentation_scope.name))
        if span.instrumentation_scope.version:
            tags.append(_jaeger_tag("otel.scope.version", span.instrumentation_scope.version))
    tags += [_jaeger_tag(key, value) for key, value in (span.attributes or {}).items()]
    tags.append(_jaeger_tag("span.kind", span.kind.name.lower()))
    if span.status.status_code is StatusCode.ERROR:
        tags.append(_jaeger_tag("otel.status_code", "ERROR"))
        tags.append(_jaeger_tag("error", True))
    elif span.status.status_code is StatusCode.OK:
        tags.append(_jaeger_tag("otel.status_code", "OK"))
    references = []
    if span.parent is not None:
        references.append(
            {"refType": "CHILD_OF", "traceID": trace_id, "spanID": f"{span.parent.span_id:016x}"}
        )
    for link in span.links:
        references.append(
            {
                "refType": "FOLLOWS_FROM",
                "traceID": f"{link.context.trace_id:032x}",
                "spanID": f"{link.context.span_id:016x}",
            }
        )
    logs = [
        {
            "timestamp": event.timestamp // 1000,
            "fields": [
                _jaeger_tag("event", event.name),
                *(_jaeger_tag(k, v) for k, v in (event.attributes or {}).items()),
            ],
        }
        for event in span.events
    ]
    return {
        "traceID": trace_id,
        "spanID": f"{span.context.span_id:016x}",
        "operationName": span.name,
        "references": references,
        "startTime": span.start_time // 1000,
        "duration": (span.end_time - span.start_time) // 1000,
        "tags": tags,
        "logs": logs,
        "processID": "p1",
        "warnings": None,
    }


def jaeger_json(spans: Sequence[ReadableSpan], service: str = "app") -> str:
    """Jaeger's answer to ``/api/traces/{id}``: ``{"data": [trace, ...]}``, one per trace."""
    traces: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        converted = _jaeger_span(span)
        traces.setdefault(converted["traceID"], []).append(converted)
    data = [
        {
            "traceID": trace_id,
            "spans": trace_spans,
            "processes": {"p1": {"serviceName": service, "tags": []}},
            "warnings": None,
        }
        for trace_id, trace_spans in traces.items()
    ]
    answer = {"data": data, "total": 0, "limit": 0, "offset": 0, "errors": None}
    return json.dumps(answer, indent=2)
