"""Trace files read back into :class:`SpanRecord`\\ s and their calls: Jaeger's JSON and OTLP
JSON, whichever a file holds, one JSON document or JSON lines.

How each format's spans are read (ids, times, kinds, typed tags and attributes, the program
that made a span) is ``trace_json``. Each problem with a file is one
:class:`~llm_latency.trace_json.TraceFileError` whose message is one line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from llm_latency.diagnosis.records import Call, SpanRecord, calls_from_spans
from llm_latency.trace_json import (
    TraceFileError,
    is_otlp,
    jaeger_error,
    jaeger_spans,
    jaeger_traces,
    otlp_spans,
)

JAEGER = "Jaeger JSON"
OTLP = "OTLP JSON"

__all__ = [
    "JAEGER",
    "OTLP",
    "TraceCalls",
    "TraceFile",
    "calls_by_trace",
    "load",
    "parse",
]


@dataclass(frozen=True)
class TraceFile:
    """The spans of one file, and the format they were read from."""

    format: str
    spans: list[SpanRecord]


@dataclass(frozen=True)
class TraceCalls:
    """The llm-latency calls of one trace, in start order."""

    trace_id: str
    calls: list[Call]


def parse(text: str, name: str = "input") -> TraceFile:
    """The spans in ``text`` (the contents of the file ``name``), whichever format it is."""
    documents = _documents(text, name)
    if all(is_otlp(document) for document in documents):
        spans = [span for document in documents for span in otlp_spans(document, name)]
        return TraceFile(OTLP, spans)
    if len(documents) == 1 and (error := jaeger_error(documents[0])) is not None:
        raise TraceFileError(f"{name} is Jaeger's answer with no trace but an error: {error}")
    if len(documents) == 1 and jaeger_traces(documents[0]) is not None:
        traces = jaeger_traces(documents[0]) or []
        return TraceFile(JAEGER, [span for trace in traces for span in jaeger_spans(trace, name)])
    raise TraceFileError(
        f'{name} is JSON, but neither Jaeger\'s trace JSON ({{"data": [...]}}) nor OTLP JSON '
        f'({{"resourceSpans": [...]}})'
    )


def load(text: str, name: str = "input") -> list[TraceCalls]:
    """The llm-latency calls of each trace in ``text``, traces in the order they started."""
    found = parse(text, name)
    if not found.spans:
        raise TraceFileError(f"{name} holds no spans ({found.format})")
    traces = [TraceCalls(trace_id, calls) for trace_id, calls in calls_by_trace(found.spans)]
    traces = [trace for trace in traces if trace.calls]
    if not traces:
        raise TraceFileError(
            f"{name} holds {len(found.spans)} spans ({found.format}), none of them an "
            "llm-latency request span: was the program instrumented with llm_latency.instrument()?"
        )
    return traces


def calls_by_trace(spans: Iterable[SpanRecord]) -> list[tuple[str, list[Call]]]:
    """Spans grouped by trace, each trace's calls read back; traces in start order."""
    by_trace: dict[str, list[SpanRecord]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    grouped = [(trace_id, calls_from_spans(records)) for trace_id, records in by_trace.items()]
    grouped.sort(key=lambda item: min((c.start_ns for c in item[1]), default=0))
    return grouped


# -- reading the text ---------------------------------------------------------------------------


def _documents(text: str, name: str) -> list[Any]:
    """One JSON document, or JSON lines (one document a line, as the file exporter writes)."""
    if not text.strip():
        raise TraceFileError(f"{name} is empty")
    try:
        return [json.loads(text)]
    except json.JSONDecodeError as whole:
        documents = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                documents.append(json.loads(line))
            except json.JSONDecodeError as exc:
                # "Extra data" after a whole first document means JSON lines: the line's own
                # error is the one to show; otherwise the document's error is.
                error, at = (exc, number) if whole.msg == "Extra data" else (whole, whole.lineno)
                raise TraceFileError(f"{name} is not JSON (line {at}: {error.msg})") from None
        return documents
