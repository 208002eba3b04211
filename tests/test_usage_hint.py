"""A stream that carried no usage (OpenAI's chat completions without ``include_usage``) has no
tokens and no time per output token: one hint says why, where the user reads (the console
tree, probe's text output), naming the request option that turns usage on; ``probe
--include-usage`` asks for it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anthropic
import openai
import pytest

from llm_latency.call_tree import calls_with_hint
from llm_latency.diagnosis import as_calls, from_readable_spans
from tests.command_line import mock_server, run_cli
from tests.conftest import Telemetry
from tests.provider_api import ProviderServer, provider_server

OPTION = '"stream_options": {"include_usage": true}'


@pytest.fixture
async def provider() -> AsyncIterator[ProviderServer]:
    async with provider_server() as server:
        yield server


def _printed(telemetry: Telemetry) -> str:
    calls = as_calls(from_readable_spans(telemetry.spans()))
    return "\n".join(calls_with_hint(calls))


async def test_the_console_tree_says_how_to_get_the_usage(
    telemetry: Telemetry, provider: ProviderServer
) -> None:
    client = openai.AsyncOpenAI(base_url=provider.openai_base, api_key="sk-t")
    stream = await client.chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    async for _ in stream:
        pass
    printed = _printed(telemetry)
    hints = [line for line in printed.splitlines() if OPTION in line]
    assert len(hints) == 1, printed
    assert "no usage" in hints[0] and "1 stream" in hints[0], hints


async def test_no_hint_when_the_stream_carried_its_usage(
    telemetry: Telemetry, provider: ProviderServer
) -> None:
    client = anthropic.AsyncAnthropic(base_url=provider.anthropic_base, api_key="sk-a")
    async with client.messages.stream(
        model="claude-test", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        async for _ in stream:
            pass
    printed = _printed(telemetry)
    assert "output_tokens=" in printed
    assert "include_usage" not in printed


def test_probe_names_the_option_and_asks_for_it() -> None:
    with mock_server("--ttfb", "0.01", "--tokens", "5", "--tokens-per-second", "500") as mock:
        plain = run_cli("probe", mock.url, "-n", "2", "--stream")
        asked = run_cli("probe", mock.url, "-n", "2", "--include-usage", "--json")
        text = run_cli("probe", mock.url, "--include-usage")
    assert plain.returncode == 0, plain.stderr
    hints = [line for line in plain.stdout.splitlines() if "--include-usage" in line]
    assert len(hints) == 1, plain.stdout
    assert "include_usage" in plain.stdout
    assert asked.returncode == 0, asked.stderr
    requests = json.loads(asked.stdout)["requests"]
    assert [r["output_tokens"] for r in requests] == [5, 5]
    assert all(r["time_per_output_token"] is not None for r in requests)
    assert all(r["stream_events"] for r in requests)  # --include-usage streams
    assert text.returncode == 0 and "include_usage" not in text.stdout
