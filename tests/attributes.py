"""Typed reads of a span's attributes: each asserts the attribute is there with the type the
test expects, so a test reads ``int_attr(span, "llm_latency.stream.events") == 3`` instead of
checking ``span.attributes`` for ``None`` and narrowing a union of attribute value types."""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.sdk.trace import ReadableSpan


def attributes(span: ReadableSpan) -> Mapping[str, object]:
    """The span's attributes (an SDK span's are a mapping, empty when it has none)."""
    assert span.attributes is not None, span.name
    return span.attributes


def str_attr(span: ReadableSpan, name: str) -> str:
    """The string attribute ``name`` of ``span``."""
    value = attributes(span)[name]
    assert isinstance(value, str), (span.name, name, value)
    return value


def int_attr(span: ReadableSpan, name: str) -> int:
    """The integer attribute ``name`` of ``span`` (a bool is not one)."""
    value = attributes(span)[name]
    assert isinstance(value, int) and not isinstance(value, bool), (span.name, name, value)
    return value


def float_attr(span: ReadableSpan, name: str) -> float:
    """The numeric attribute ``name`` of ``span`` (seconds, mostly), as a float."""
    value = attributes(span)[name]
    assert isinstance(value, int | float) and not isinstance(value, bool), (span.name, name, value)
    return float(value)


def longest_gap_seen(span: ReadableSpan) -> float:
    """A stream's longest gap as its chunks arrived, at most: ``llm_latency.stream.max_gap``
    (the provider's and the network's pause) plus the event-loop lag, which that attribute
    leaves out (a late loop, a loaded machine, holds a chunk back)."""
    lag = attributes(span).get("llm_latency.event_loop.lag", 0.0)
    assert isinstance(lag, float)
    return float_attr(span, "llm_latency.stream.max_gap") + lag


def held_back(span: ReadableSpan, request: ReadableSpan | None = None) -> float:
    """How long the loop was held back in ``span`` (a request span, or one of ``request``'s
    phases), as the product measures it: its ``llm_latency.event_loop.lag`` (the program's own
    stalls: a collection of a test worker's whole heap takes a second on a loaded 2-core
    machine) plus the attempt's ``llm_latency.event_loop.descheduled`` (the machine kept the
    loop's thread from a CPU). 0 where neither was measured (a loop on time, a sync client)."""
    lag = attributes(span).get("llm_latency.event_loop.lag", 0.0)
    descheduled = attributes(request or span).get("llm_latency.event_loop.descheduled", 0.0)
    assert isinstance(lag, float) and isinstance(descheduled, float), (lag, descheduled)
    return lag + descheduled
