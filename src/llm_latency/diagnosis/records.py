"""Finished calls as plain records: what the diagnosis, the CLI and ``explain`` read.

Spans come in three shapes: the SDK's ``ReadableSpan`` (the CLI and the development exporter),
Jaeger's JSON and OTLP JSON (``explain``). Each is first turned into a :class:`SpanRecord`, then
:func:`calls_from_spans` reads llm-latency's span model back: request spans (one per attempt)
with their phase children, ``retry.backoff`` spans, and the logical parent that groups them.

The records are in :mod:`~llm_latency.diagnosis.model`, the reading of spans in
:mod:`~llm_latency.diagnosis.reading` and the grouping into calls in
:mod:`~llm_latency.diagnosis.grouping`; this module is where the rest of llm-latency takes them
from.
"""

from __future__ import annotations

from llm_latency.diagnosis.grouping import (
    calls_from_spans,
    is_http_client_span,
    logical_parent_id,
)
from llm_latency.diagnosis.model import (
    RATELIMIT_HEADERS,
    SETUP_PHASES,
    Attempt,
    Backoff,
    Call,
    Phase,
    SpanRecord,
    is_success,
)
from llm_latency.diagnosis.reading import (
    children_by_parent,
    from_readable_spans,
    is_attempt,
    is_backoff,
    to_attempt,
    to_backoff,
)

__all__ = [
    "RATELIMIT_HEADERS",
    "SETUP_PHASES",
    "Attempt",
    "Backoff",
    "Call",
    "Phase",
    "SpanRecord",
    "calls_from_spans",
    "children_by_parent",
    "from_readable_spans",
    "is_attempt",
    "is_backoff",
    "is_http_client_span",
    "is_success",
    "logical_parent_id",
    "to_attempt",
    "to_backoff",
]
