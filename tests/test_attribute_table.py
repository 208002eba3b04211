"""The attribute table, fed plain values: which fact each attribute carries, when it is kept (a
value that is not None; for some, not zero or empty either), in the order the span gets them.
And every path of the table reads a field the emitter's records really have."""

from __future__ import annotations

from operator import attrgetter
from types import SimpleNamespace
from typing import Any, cast

import pytest

from llm_latency.attempt_record import AttemptRecord
from llm_latency.attribute_table import (
    END_ATTRIBUTES,
    TOKEN_ATTRIBUTES,
    end_attributes,
    token_attributes,
)
from llm_latency.facts import AttemptFacts, read_facts
from llm_latency.timeline import Timeline

FACTS = (
    "status", "event_loop_lag", "descheduled", "server_processing", "network_overhead",
    "time_to_first_chunk", "stream_events", "stream_max_gap", "stream_mean_interval",
    "stream_chunk_rate", "failed_phase", "error_type", "usage", "usage_unknown",
    "time_to_first_token", "time_per_output_token", "server_time_per_output_token_max",
    "request_id", "queue_time",
)  # fmt: skip
HEADERS = {"x-request-id": "http.response.header.x-request-id"}


def record(
    headers: dict[str, list[str]] | None = None,
    resend_count: int = 0,
    provider: str | None = None,
    timeline: dict[str, Any] | None = None,
    **facts: Any,
) -> AttemptRecord:
    """A record as plain objects: every fact None but those given."""
    return cast(
        AttemptRecord,
        SimpleNamespace(
            facts=SimpleNamespace(**{**dict.fromkeys(FACTS), "headers": headers or {}, **facts}),
            timeline=SimpleNamespace(
                **{
                    "protocol_version": None,
                    "reused": None,
                    "closed_by": None,
                    "peer_address": None,
                    "proxy_url": None,
                    **(timeline or {}),
                }
            ),
            resend_count=resend_count,
            provider=provider,
        ),
    )


def test_nothing_known_is_no_attribute() -> None:
    assert end_attributes(record(), HEADERS) == {}
    assert token_attributes(record()) == {}


def test_a_zero_kept_where_it_is_a_measurement_dropped_where_it_means_none() -> None:
    """A JSON answer on a reused connection whose loop never lagged: the lag (0.0) and
    ``reused`` False are what was measured; no resend (0), no machine's share (0.0) and an
    unread protocol ("") are nothing to say."""
    attributes = end_attributes(
        record(
            headers={"x-request-id": ["a", "b"]},
            status=200,
            event_loop_lag=0.0,
            descheduled=0.0,
            server_processing=0.0,
            timeline={"protocol_version": "", "reused": False},
        ),
        HEADERS,
    )
    assert attributes == {
        "http.response.header.x-request-id": ("a", "b"),
        "http.response.status_code": 200,
        "llm_latency.connection.reused": False,
        "llm_latency.event_loop.lag": 0.0,
        "llm_latency.server.processing_time": 0.0,
    }


def test_every_end_attribute_in_the_tables_order() -> None:
    attributes = end_attributes(
        record(
            headers={"x-request-id": ["r"]},
            resend_count=2,
            status=503,
            event_loop_lag=0.25,
            descheduled=0.05,
            server_processing=0.18,
            network_overhead=0.01,
            time_to_first_chunk=0.3,
            stream_events=12,
            stream_max_gap=0.04,
            stream_mean_interval=0.02,
            stream_chunk_rate=50.0,
            failed_phase="receive",
            error_type="ReadError",
            timeline={
                "protocol_version": "2",
                "reused": True,
                "closed_by": "Connection: close",
                "peer_address": "192.0.2.7",
                "proxy_url": "http://user:secret@proxy.test:3128/path",
            },
        ),
        HEADERS,
    )
    assert list(attributes.items()) == [
        ("http.response.header.x-request-id", ("r",)),
        ("http.response.status_code", 503),
        ("network.protocol.version", "2"),
        ("llm_latency.connection.reused", True),
        ("llm_latency.connection.closed_by", "Connection: close"),
        ("network.peer.address", "192.0.2.7"),
        ("llm_latency.proxy.url", "http://proxy.test:3128"),  # never its user or password
        ("http.request.resend_count", 2),
        ("llm_latency.event_loop.lag", 0.25),
        ("llm_latency.event_loop.descheduled", 0.05),
        ("llm_latency.server.processing_time", 0.18),
        ("llm_latency.network_overhead", 0.01),
        ("gen_ai.response.time_to_first_chunk", 0.3),
        ("llm_latency.stream.events", 12),
        ("llm_latency.stream.max_gap", 0.04),
        ("llm_latency.stream.mean_interval", 0.02),
        ("llm_latency.stream.chunk_rate", 50.0),
        ("llm_latency.failed_phase", "receive"),
        ("error.type", "ReadError"),
    ]


def test_the_tokens_of_an_answer_usage_first() -> None:
    usage = SimpleNamespace(input_tokens=12, output_tokens=3, model="gpt-x", queue_time=None)
    streamed = record(
        provider="openai", usage=usage, time_to_first_token=0.26, time_per_output_token=0.01
    )
    assert list(token_attributes(streamed).items()) == [
        ("gen_ai.usage.input_tokens", 12),
        ("gen_ai.usage.output_tokens", 3),
        ("gen_ai.response.model", "gpt-x"),
        ("gen_ai.provider.name", "openai"),
        ("llm_latency.time_to_first_token", 0.26),
        ("llm_latency.time_per_output_token", 0.01),
    ]
    unknown = record(usage_unknown=True, time_to_first_token=0.2)
    assert token_attributes(unknown) == {
        "llm_latency.usage.unknown": True,
        "llm_latency.time_to_first_token": 0.2,
    }
    assert token_attributes(record(usage_unknown=False, server_time_per_output_token_max=0.5)) == {
        "llm_latency.server.time_per_output_token_max": 0.5
    }


def test_the_request_id_and_the_queue_time_are_scalars_on_the_request_span() -> None:
    queued = record(request_id="req_abc", queue_time=0.12)
    assert end_attributes(queued, HEADERS) == {
        "llm_latency.request_id": "req_abc",
        "llm_latency.queue_time": 0.12,
    }


def test_token_counts_that_say_nothing_at_zero_are_left_out() -> None:
    """OpenAI reports ``cached_tokens: 0`` and ``reasoning_tokens: 0`` on every answer; an
    output of 0 tokens is news, and stays."""
    usage = SimpleNamespace(
        input_tokens=5, output_tokens=0, cache_read_tokens=0, reasoning_tokens=0, model="m"
    )
    assert token_attributes(record(usage=usage)) == {
        "gen_ai.usage.input_tokens": 5,
        "gen_ai.usage.output_tokens": 0,
        "gen_ai.response.model": "m",
    }
    usage.cache_read_tokens, usage.reasoning_tokens = 3, 7
    assert token_attributes(record(usage=usage)) == {
        "gen_ai.usage.input_tokens": 5,
        "gen_ai.usage.output_tokens": 0,
        "gen_ai.usage.cache_read.input_tokens": 3,
        "gen_ai.usage.reasoning.output_tokens": 7,
        "gen_ai.response.model": "m",
    }


@pytest.mark.parametrize("row", [*END_ATTRIBUTES, *TOKEN_ATTRIBUTES], ids=lambda row: row.source)
def test_every_row_reads_a_field_of_a_real_record(row: Any) -> None:
    """A path that names no field would fail every attempt's end (caught, logged once, the
    attributes lost): each is read from a record the emitter makes."""
    timeline = Timeline("POST", "https://api.openai.com/v1/chat/completions")
    timeline.close()
    real = AttemptRecord(timeline, cast(Any, None), cast(Any, None), "POST", "h", 443, 0, None)
    real.facts = read_facts(timeline, None, frozenset())
    assert isinstance(real.facts, AttemptFacts)
    attrgetter(row.source)(real)
