"""When llm-latency traces a request: OTel suppression, and other instrumentations' spans.

- ``suppress_instrumentation()`` (the OTLP exporters' own requests, for one): never traced.
- ``suppress_http_instrumentation()``: not traced, unless the span that set it is an official
  HTTP client instrumentation's request span (``opentelemetry-instrumentation-requests`` sets it
  around every request it traces): then llm-latency still records the phases, under that span.
- ``suppress_http_instrumentation()`` under a GenAI span (a recording span with a ``gen_ai.*``
  attribute, from any provider's GenAI instrumentation): traced, beneath that span.
  ``opentelemetry-instrumentation-botocore`` suppresses HTTP instrumentation around every AWS
  call it traces, its Bedrock inferences included; the phases of those calls are what
  llm-latency is for. Its other calls (S3, DynamoDB, ...) carry no GenAI attribute and stay
  suppressed.
- Under an official HTTP client instrumentation's CLIENT span, llm-latency's attempt span is
  INTERNAL, so each request has one CLIENT span (theirs), with ours and the phases beneath it.
"""

from __future__ import annotations

from typing import Final

from opentelemetry.instrumentation.utils import (
    is_http_instrumentation_enabled,
    is_instrumentation_enabled,
)
from opentelemetry.trace import SpanKind, get_current_span

#: The official instrumentations whose CLIENT spans stand for the same HTTP request.
HTTP_CLIENT_SCOPES: Final = frozenset(
    {
        "opentelemetry.instrumentation.aiohttp_client",
        "opentelemetry.instrumentation.httpx",
        "opentelemetry.instrumentation.requests",
        "opentelemetry.instrumentation.urllib3",
        "opentelemetry.instrumentation.urllib",
    }
)


def under_http_client_span() -> bool:
    """Whether the current span is an official HTTP client instrumentation's request span."""
    span = get_current_span()
    if getattr(span, "kind", None) is not SpanKind.CLIENT or not span.is_recording():
        return False
    scope = getattr(span, "instrumentation_scope", None)
    return scope is not None and scope.name in HTTP_CLIENT_SCOPES


def under_genai_span() -> bool:
    """Whether the current span is a GenAI span: recording, with a ``gen_ai.*`` attribute."""
    span = get_current_span()
    if not span.is_recording():
        return False
    attributes = getattr(span, "attributes", None) or {}
    return any(key.startswith("gen_ai.") for key in attributes)


def tracing_allowed() -> bool:
    """Whether the request about to start is to be traced (see the module docstring)."""
    if is_http_instrumentation_enabled():
        return True
    return is_instrumentation_enabled() and (under_http_client_span() or under_genai_span())
