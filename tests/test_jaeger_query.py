"""What Jaeger's answers say of tail sampling (``jaeger_query.tail_sampling``), in the two shapes
Jaeger serves: the API v3's OTLP JSON (resource and scope attributes) and the UI's JSON
(a process's and a span's tags). The real Jaeger, behind the real gateways, is in
tests/e2e/test_tail_sampling.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from llm_latency.cli.explain import sampled_warning
from llm_latency.jaeger_query import (
    TAIL_SAMPLED,
    TAIL_SAMPLING_POLICY,
    since_seconds,
    tail_sampling,
)


def v3_answer(
    resource: Sequence[dict[str, Any]] = (), scope: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """An API v3 ``result``: one resource, one scope, one span."""
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [
                    {"key": "service.name", "value": {"stringValue": "checkout"}}, *resource
                ]},
                "scopeSpans": [
                    {
                        "scope": {"name": "llm-latency", "attributes": list(scope)},
                        "spans": [{"name": "POST /v1/chat/completions", "attributes": []}],
                    }
                ],
            }
        ]
    }  # fmt: skip


def v2_answer(process_tags: list[dict[str, Any]], span_tags: list[dict[str, Any]]) -> list[Any]:
    """The UI API's ``data``: one trace, one process, one span."""
    return [
        {
            "traceID": "0af7651916cd43dd8448eb211c80319c",
            "spans": [{"operationName": "POST /v1/chat/completions", "tags": span_tags}],
            "processes": {"p1": {"serviceName": "checkout", "tags": process_tags}},
        }
    ]


def test_the_gateway_s_mark_on_the_resource() -> None:
    marked = v3_answer(resource=[{"key": TAIL_SAMPLED, "value": {"boolValue": True}}])
    assert tail_sampling(marked) == (True, [])


def test_the_gateway_s_mark_among_a_process_s_tags() -> None:
    tag = {"key": TAIL_SAMPLED, "type": "bool", "value": True}
    assert tail_sampling(v2_answer([tag], [])) == (True, [])


def test_the_policies_the_collector_names() -> None:
    policy = {"key": TAIL_SAMPLING_POLICY, "value": {"stringValue": "keep-errors"}}
    assert tail_sampling(v3_answer(scope=[policy])) == (True, ["keep-errors"])
    tags = [{"key": TAIL_SAMPLING_POLICY, "type": "string", "value": name} for name in "ba"]
    assert tail_sampling(v2_answer([], tags)) == (True, ["a", "b"])


@pytest.mark.parametrize(
    "answer",
    [
        v3_answer(),
        v3_answer(resource=[{"key": TAIL_SAMPLED, "value": {"boolValue": False}}]),
        v2_answer([{"key": TAIL_SAMPLED, "type": "bool", "value": False}], []),
        v2_answer([{"key": "hostname", "type": "string", "value": TAIL_SAMPLED}], []),
    ],
    ids=["unmarked", "false", "false tag", "the name as a value"],
)
def test_traces_that_do_not_say_so(answer: Any) -> None:
    assert tail_sampling(answer) == (False, [])


def test_the_warning_says_what_told_it() -> None:
    assert "(keep-errors, keep-slow)" in sampled_warning(["keep-errors", "keep-slow"], True)
    assert f"the spans carry {TAIL_SAMPLED}" in sampled_warning([], True)
    assert "(--tail-sampled)" in sampled_warning([])


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("15m", 900), ("1h30m", 5400), ("2d", 172800)]
)
def test_since(text: str, seconds: float) -> None:
    assert since_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "1x", "h", "1h 30m", "-5m"])
def test_since_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        since_seconds(text)
