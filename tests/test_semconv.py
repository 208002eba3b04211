"""The GenAI names llm-latency writes out in ``semconv.py`` are the conventions' own strings, for
as long as ``opentelemetry-semantic-conventions`` still has them; and ``semconv.py`` needs none
of the package's deprecated GenAI modules to import."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from llm_latency import semconv

SEMCONV = Path(semconv.__file__)
#: Where the package keeps its GenAI constants (documented as deprecated: moved to the GenAI
#: conventions project).
MODULES = (
    "opentelemetry.semconv._incubating.attributes.gen_ai_attributes",
    "opentelemetry.semconv._incubating.metrics.gen_ai_metrics",
)
#: The released conventions' names (semantic-conventions-genai v0.1.0: docs/gen-ai/
#: client-inference.md and gen-ai-token-metrics.md) and the opt-in's values, which this package
#: never carried: checked against the strings those documents give.
RELEASED = {
    "GEN_AI_CLIENT_INFERENCE_OPERATION_INPUT_TOKENS": "gen_ai.client.inference.operation.input_tokens",
    "GEN_AI_CLIENT_INFERENCE_OPERATION_OUTPUT_TOKENS": "gen_ai.client.inference.operation.output_tokens",
    "GEN_AI_CLIENT_INFERENCE_TIME_PER_OUTPUT_CHUNK": "gen_ai.client.inference.time_per_output_chunk",
    "GEN_AI_CLIENT_INFERENCE_TIME_TO_FIRST_CHUNK": "gen_ai.client.inference.time_to_first_chunk",
    "GEN_AI_CLIENT_INFERENCE_USAGE_CACHE_READ_INPUT_TOKENS":
        "gen_ai.client.inference.usage.cache_read.input_tokens",
    "GEN_AI_CLIENT_INFERENCE_USAGE_CACHE_WRITE_INPUT_TOKENS":
        "gen_ai.client.inference.usage.cache_write.input_tokens",
    "GEN_AI_CLIENT_INFERENCE_USAGE_INPUT_TOKENS": "gen_ai.client.inference.usage.input_tokens",
    "GEN_AI_CLIENT_INFERENCE_USAGE_OUTPUT_TOKENS": "gen_ai.client.inference.usage.output_tokens",
    "GEN_AI_CLIENT_INFERENCE_USAGE_REASONING_OUTPUT_TOKENS":
        "gen_ai.client.inference.usage.reasoning.output_tokens",
    "GEN_AI_LATEST_EXPERIMENTAL": "gen_ai_latest_experimental",
    "GEN_AI_LATEST_EXPERIMENTAL_DUP": "gen_ai_latest_experimental/dup",
    "GEN_AI_TOKEN_MODALITY": "gen_ai.token.modality",
    "GEN_AI_TOKEN_MODALITY_UNKNOWN": "unknown",
    "GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS": "gen_ai.usage.cache_write.input_tokens",
}  # fmt: skip
OURS = {
    name: value
    for name, value in vars(semconv).items()
    if name.startswith("GEN_AI_")
    and not name.startswith("GEN_AI_TOKEN_TYPE_")
    and name not in RELEASED
}


def package_constants() -> dict[str, str]:
    """The package's GEN_AI_* strings, from whichever of its GenAI modules it still ships."""
    found: dict[str, str] = {}
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        found.update(
            {name: value for name, value in vars(module).items() if isinstance(value, str)}
        )
    return found


@pytest.mark.parametrize("name", sorted(OURS))
def test_each_genai_name_is_the_packages_string(name: str) -> None:
    theirs = package_constants()
    if name not in theirs:
        pytest.skip(f"this opentelemetry-semantic-conventions has no {name} any more")
    assert OURS[name] == theirs[name]


def test_the_released_names_are_the_conventions_strings() -> None:
    assert {name: getattr(semconv, name) for name in RELEASED} == RELEASED


def test_the_token_types_are_the_packages_values() -> None:
    try:
        module = importlib.import_module(MODULES[0])
    except ImportError:
        pytest.skip("this opentelemetry-semantic-conventions has no GenAI attributes any more")
    values = {member.value for member in module.GenAiTokenTypeValues}
    assert {semconv.GEN_AI_TOKEN_TYPE_INPUT, semconv.GEN_AI_TOKEN_TYPE_OUTPUT} <= values


def test_semconv_imports_no_genai_module() -> None:
    tree = ast.parse(SEMCONV.read_text())
    imported = [
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None
    ]
    assert imported, "the check reads semconv.py's imports"
    assert not [module for module in imported if "gen_ai" in module]
