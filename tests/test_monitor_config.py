"""``llm-latency watch``'s config file: every problem is one clear error line before any probe
is sent, and a key never reaches the file, the output or the error."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_latency.cli.monitor_config import EDGE, INFERENCE, load_config
from tests.command_line import one_error_line, run_cli

GOOD = """
[monitor]
every = "30s"

[[endpoint]]
name = "openai-eu"
url = "https://api.openai.com/v1"
provider = "openai"
model = "gpt-4o-mini"
api_key_env = "LLM_LATENCY_TEST_KEY"
labels = { region = "eu-west-1" }
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "endpoints.toml"
    path.write_text(text)
    return str(path)


def test_a_good_file_gives_endpoints_kinds_and_the_calls_per_day(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLM_LATENCY_TEST_KEY", "sk-test-0123456789")
    config = load_config(write(tmp_path, GOOD))
    (endpoint,) = config.endpoints
    assert endpoint.labels == {"region": "eu-west-1"}
    assert endpoint.kinds == (EDGE, INFERENCE)
    assert endpoint.every == 30.0
    assert config.calls_per_day() == {EDGE: 2880, INFERENCE: 2880}


def test_a_key_given_inline_is_refused(tmp_path: Path) -> None:
    secret = "sk-inline-0123456789abcdef"
    text = GOOD.replace('api_key_env = "LLM_LATENCY_TEST_KEY"', f'api_key = "{secret}"')
    line = one_error_line(run_cli("watch", write(tmp_path, text)))
    assert "a key may not be written in the config file ('api_key')" in line
    assert "api_key_env" in line
    assert secret not in line


def test_a_key_given_as_the_variable_name_is_refused(tmp_path: Path) -> None:
    secret = "sk-proj-abc/def+0123456789"
    text = GOOD.replace("LLM_LATENCY_TEST_KEY", secret)
    line = one_error_line(run_cli("watch", write(tmp_path, text)))
    assert "api_key_env must be the name of an environment variable, not the key" in line
    assert secret not in line


def test_a_url_with_credentials_is_refused(tmp_path: Path) -> None:
    text = GOOD.replace("https://api.openai.com/v1", "https://user:hunter22@api.openai.com/v1")
    line = one_error_line(
        run_cli("watch", write(tmp_path, text), env={"LLM_LATENCY_TEST_KEY": "sk-x"})
    )
    assert "url may not carry credentials" in line
    assert "hunter22" not in line


def test_an_unknown_provider_profile_gets_a_clear_error(tmp_path: Path) -> None:
    text = GOOD.replace('provider = "openai"', 'provider = "openia"')
    line = one_error_line(
        run_cli("watch", write(tmp_path, text), env={"LLM_LATENCY_TEST_KEY": "sk-x"})
    )
    assert line == (
        "llm-latency: error: endpoint 'openai-eu': unknown provider profile 'openia' "
        "(known: anthropic, ollama, openai, openai-compatible)"
    )


def test_a_missing_environment_variable_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLM_LATENCY_TEST_KEY", raising=False)
    result = run_cli("watch", write(tmp_path, GOOD))
    assert one_error_line(result) == (
        "llm-latency: error: endpoint 'openai-eu': the environment variable "
        "LLM_LATENCY_TEST_KEY (api_key_env) is not set"
    )


def test_an_interval_below_the_cost_guard_is_refused(tmp_path: Path) -> None:
    result = run_cli(
        "watch", write(tmp_path, GOOD), "--every", "2s", env={"LLM_LATENCY_TEST_KEY": "sk-x"}
    )
    line = one_error_line(result)
    assert "every 2s is below the minimum interval 10s" in line


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('kinds = ["edge"]\nname', 'kinds = ["edgy"]\nname'), "kinds must be a list of"),
        (("labels = {", "colour = 1\nlabels = {"), "unknown field 'colour'"),
        (('region = "eu-west-1"', 'le = "x"'), "label name 'le' is not allowed"),
        (('every = "30s"', 'every = "soon"'), "[monitor] every: 'soon' is not a duration"),
    ],
)
def test_other_mistakes_are_one_line_each(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    text = GOOD.replace('name = "openai-eu"', 'kinds = ["edge"]\nname = "openai-eu"')
    assert change[0] in text
    result = run_cli(
        "watch", write(tmp_path, text.replace(*change)), env={"LLM_LATENCY_TEST_KEY": "sk-x"}
    )
    assert message in one_error_line(result)
