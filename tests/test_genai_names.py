"""The GenAI names under ``OTEL_SEMCONV_STABILITY_OPT_IN``: the old ones by default, the
released ones (semantic-conventions-genai v0.1.0) with ``gen_ai_latest_experimental``, both
with ``gen_ai_latest_experimental/dup``; the metric points each mode exports for real SDK
calls to the mock model server, read with the SDK's in-memory reader."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest

from llm_latency import semconv
from llm_latency.settings import genai_names
from llm_latency.testing import Profile, RunningServer, running
from tests.conftest import Telemetry

PROMPT = "one two three four five six"  # the mock counts words: 6 prompt tokens
PROMPT_TOKENS = 6
MAX_TOKENS = 8
MESSAGES: list[Any] = [{"role": "user", "content": PROMPT}]
OPT_IN = "OTEL_SEMCONV_STABILITY_OPT_IN"

OLD_NAMES = (
    "gen_ai.client.operation.time_to_first_chunk",
    "gen_ai.client.token.usage",
)
NEW_NAMES = (
    "gen_ai.client.inference.time_to_first_chunk",
    "gen_ai.client.inference.usage.input_tokens",
    "gen_ai.client.inference.usage.output_tokens",
    "gen_ai.client.inference.operation.input_tokens",
    "gen_ai.client.inference.operation.output_tokens",
)


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("", semconv.GenAINames.OLD),
        ("http,database/dup", semconv.GenAINames.OLD),
        ("http, gen_ai_latest_experimental", semconv.GenAINames.LATEST),
        ("gen_ai_latest_experimental,gen_ai_latest_experimental/dup", semconv.GenAINames.DUP),
        ("gen_ai_latest_experimental/dup", semconv.GenAINames.DUP),
        ("GEN_AI_LATEST_EXPERIMENTAL", semconv.GenAINames.OLD),  # as the official parse: exact
    ],
)
def test_the_opt_in_is_read_as_the_official_instrumentations_read_it(
    value: str, names: semconv.GenAINames
) -> None:
    assert genai_names({OPT_IN: value}) is names


@pytest.fixture
async def server() -> AsyncIterator[RunningServer]:
    async with running(Profile(ttfb=0.02, tokens=20, tokens_per_second=400)) as mock:
        yield mock


def instrumented(request: pytest.FixtureRequest, opt_in: str | None) -> Telemetry:
    """The suite's ``telemetry``, instrumented with ``OTEL_SEMCONV_STABILITY_OPT_IN`` set to
    ``opt_in`` (None: unset)."""
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    if opt_in is None:
        monkeypatch.delenv(OPT_IN, raising=False)
    else:
        monkeypatch.setenv(OPT_IN, opt_in)
    telemetry: Telemetry = request.getfixturevalue("telemetry")
    return telemetry


@pytest.fixture
def default(request: pytest.FixtureRequest) -> Telemetry:
    return instrumented(request, None)


@pytest.fixture
def latest(request: pytest.FixtureRequest) -> Telemetry:
    return instrumented(request, "http,gen_ai_latest_experimental")


@pytest.fixture
def dup(request: pytest.FixtureRequest) -> Telemetry:
    return instrumented(request, "gen_ai_latest_experimental/dup")


async def openai_stream(server: RunningServer, *, usage: bool = True) -> None:
    client = openai.AsyncOpenAI(base_url=server.url("/v1"), api_key="sk-test", max_retries=0)
    stream = await client.chat.completions.create(
        model="gpt-test",
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True} if usage else None,
    )
    async for _ in stream:
        pass
    await client.close()


async def anthropic_message(server: RunningServer) -> None:
    client = anthropic.AsyncAnthropic(base_url=server.url(""), api_key="sk-ant-test")
    async with client.messages.stream(
        model="claude-test", max_tokens=MAX_TOKENS, messages=MESSAGES
    ) as stream:
        async for _ in stream.text_stream:
            pass
    await client.close()


def by_name(telemetry: Telemetry, names: tuple[str, ...]) -> dict[str, list[Any]]:
    return {name: telemetry.metric_points(name) for name in names}


def one(points: list[Any]) -> tuple[Any, dict[str, Any]]:
    (point,) = points
    return point, dict(point.attributes)


async def test_by_default_the_old_names_only(default: Telemetry, server: RunningServer) -> None:
    await openai_stream(server)
    assert all(by_name(default, OLD_NAMES).values())
    assert not any(by_name(default, NEW_NAMES).values())
    (request,) = default.requests()
    assert semconv.GEN_AI_OPERATION_NAME not in dict(request.attributes or {})


async def test_the_opt_in_records_the_released_names_instead(
    latest: Telemetry, server: RunningServer
) -> None:
    await openai_stream(server)
    assert not any(by_name(latest, OLD_NAMES).values()), "the old names are replaced"
    port = server.port
    where = {"server.address": "127.0.0.1", "server.port": port}
    # An OpenAI-compatible server on a host of its own: the route says the operation, nothing
    # says the provider.
    named = {**where, "gen_ai.operation.name": "chat", "gen_ai.response.model": "gpt-test"}
    ttfc, attributes = one(latest.metric_points("gen_ai.client.inference.time_to_first_chunk"))
    assert (ttfc.count, attributes) == (1, named)
    assert list(ttfc.explicit_bounds) == list(semconv.GENAI_DURATION_BUCKETS)
    (request,) = latest.requests()
    found = dict(request.attributes or {})
    assert ttfc.sum == pytest.approx(found["gen_ai.response.time_to_first_chunk"])
    assert found["gen_ai.operation.name"] == "chat"
    counted = {**named, "gen_ai.token.modality": "unknown"}
    for kind, count in (("input", PROMPT_TOKENS), ("output", MAX_TOKENS)):
        total, attributes = one(
            latest.metric_points(f"gen_ai.client.inference.usage.{kind}_tokens")
        )
        assert (total.value, attributes) == (count, counted), kind
        spread, attributes = one(
            latest.metric_points(f"gen_ai.client.inference.operation.{kind}_tokens")
        )
        # per operation, not by modality
        assert (spread.count, spread.sum, attributes) == (1, count, named), kind
    # OpenAI's cached_tokens and reasoning_tokens are 0 here: counted as the server said.
    for kind in ("cache_read.input_tokens", "reasoning.output_tokens"):
        points = latest.metric_points(f"gen_ai.client.inference.usage.{kind}")
        assert [p.value for p in points] in ([], [0]), kind
    # The span attributes Jaeger's GenAI view reads stay.
    assert (found["gen_ai.usage.input_tokens"], found["gen_ai.usage.output_tokens"]) == (
        PROMPT_TOKENS,
        MAX_TOKENS,
    )


async def test_an_anthropic_answer_names_its_provider_and_cache_writes(
    latest: Telemetry, server: RunningServer
) -> None:
    await anthropic_message(server)
    _, attributes = one(latest.metric_points("gen_ai.client.inference.time_to_first_chunk"))
    assert attributes["gen_ai.provider.name"] == "anthropic"
    assert attributes["gen_ai.operation.name"] == "chat"
    total, attributes = one(latest.metric_points("gen_ai.client.inference.usage.input_tokens"))
    assert total.value == PROMPT_TOKENS
    # The mock's cache_creation_input_tokens is 0: the cache_write counter counts it.
    (writes,) = latest.metric_points("gen_ai.client.inference.usage.cache_write.input_tokens")
    assert writes.value == 0


async def test_a_stream_without_usage_counts_zero_of_unknown_modality(
    latest: Telemetry, server: RunningServer
) -> None:
    await openai_stream(server, usage=False)
    for kind in ("input", "output"):
        total, attributes = one(
            latest.metric_points(f"gen_ai.client.inference.usage.{kind}_tokens")
        )
        assert (total.value, attributes["gen_ai.token.modality"]) == (0, "unknown")
        # no false 0 in the per-operation distribution
        assert latest.metric_points(f"gen_ai.client.inference.operation.{kind}_tokens") == []


async def test_dup_records_both_names_with_the_same_counts(
    dup: Telemetry, server: RunningServer
) -> None:
    await openai_stream(server)
    (old_ttfc,) = dup.metric_points("gen_ai.client.operation.time_to_first_chunk")
    (new_ttfc,) = dup.metric_points("gen_ai.client.inference.time_to_first_chunk")
    assert new_ttfc.sum == old_ttfc.sum
    old_tokens = {
        dict(p.attributes)["gen_ai.token.type"]: p.sum
        for p in dup.metric_points("gen_ai.client.token.usage")
    }
    new_tokens = {
        kind: one(dup.metric_points(f"gen_ai.client.inference.usage.{kind}_tokens"))[0].value
        for kind in ("input", "output")
    }
    assert old_tokens == new_tokens == {"input": PROMPT_TOKENS, "output": MAX_TOKENS}


async def test_the_opt_in_is_read_once_at_instrument(
    default: Telemetry, server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(OPT_IN, "gen_ai_latest_experimental")  # too late: instrument() read it
    await openai_stream(server)
    assert all(by_name(default, OLD_NAMES).values())
    assert not any(by_name(default, NEW_NAMES).values())
