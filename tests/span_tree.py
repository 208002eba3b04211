"""Exported spans as one nested structure, for tests that compare a whole trace at once.

``span_tree(spans)`` gives each root span, in start order, as
``{"name", "kind", "attributes", "children"}``, its children the same way. Times are left out
(a test bounds them where they matter, with :mod:`tests.checks`), so is ``llm_latency.client``,
and so are the values that
change from run to run: the server's port is ``PORT`` in URLs and ``server.port``, and measured
durations among the attributes compare with ``dirty_equals`` matchers in the expected tree (a
phase span's event-loop lag, there only when the loop happened to be late, is left out too:
tests/test_event_loop_lag.py checks it; so is a request span's ``event_loop.descheduled``,
there only when the machine took the loop's CPU: tests/test_descheduled.py checks it). A
test then states what the trace must be in one literal, as pydantic/logfire's integration tests
do. (inline-snapshot, which writes such literals, needs rich 13.7.1 or later: the oldest
supported set tests the CLI on rich 13.0.)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

_PORT = re.compile(r"(127\.0\.0\.1|localhost|\[::1\]):\d+")
#: Attributes the trees leave out: the client library's name (each test knows its client;
#: tests/test_scenarios.py checks what every adapter records).
_LEFT_OUT = frozenset({"llm_latency.client"})


def _value(name: str, value: Any) -> Any:
    if name == "server.port":
        return "PORT"
    if isinstance(value, str):
        return _PORT.sub(r"\1:PORT", value)
    if isinstance(value, tuple):
        return [_value(name, item) for item in value]
    return value


def _node(span: ReadableSpan, by_parent: dict[int, list[ReadableSpan]]) -> dict[str, Any]:
    assert span.context is not None
    attributes = dict(span.attributes or {})
    if "llm_latency.phase" in attributes:
        attributes.pop("llm_latency.event_loop.lag", None)
    attributes.pop("llm_latency.event_loop.descheduled", None)
    node: dict[str, Any] = {
        "name": span.name,
        "kind": span.kind.name,
        "attributes": {
            k: _value(k, v) for k, v in sorted(attributes.items()) if k not in _LEFT_OUT
        },
    }
    kids = by_parent.get(span.context.span_id, [])
    if kids:
        node["children"] = [_node(kid, by_parent) for kid in kids]
    return node


def span_tree(spans: Iterable[ReadableSpan]) -> list[dict[str, Any]]:
    """The spans as trees: roots (spans whose parent is not among them) in start order."""
    spans = sorted(spans, key=lambda s: s.start_time or 0)
    ids = {s.context.span_id for s in spans if s.context is not None}
    by_parent: dict[int, list[ReadableSpan]] = {}
    roots = []
    for span in spans:
        if span.parent is not None and span.parent.span_id in ids:
            by_parent.setdefault(span.parent.span_id, []).append(span)
        else:
            roots.append(span)
    return [_node(root, by_parent) for root in roots]


def phase_nodes(*phases: str, host: str = "127.0.0.1") -> list[dict[str, Any]]:
    """The phase spans of an attempt to ``host``, as :func:`span_tree` gives them."""
    return [
        {
            "name": f"http.{phase}",
            "kind": "INTERNAL",
            "attributes": {"llm_latency.phase": phase, "server.address": host},
        }
        for phase in phases
    ]
