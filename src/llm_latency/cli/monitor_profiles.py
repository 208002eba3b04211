"""What ``llm-latency watch`` sends to each kind of endpoint: per provider, the cheap *edge*
request (DNS, connect, TLS and time to first byte, no tokens) and the *inference* request (a
streamed completion of one output token at most), and how the API key is sent.

The endpoint's ``url`` is the API's base (``https://api.openai.com/v1``); the paths below are
joined to it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

#: The most output tokens an inference probe asks for: the cost guard.
MAX_OUTPUT_TOKENS: Final = 1
_PROMPT: Final = "Say OK."


@dataclass(frozen=True)
class ProbeCall:
    """One request: method, path under the base URL, headers and body."""

    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes | None


@dataclass(frozen=True)
class MonitorProfile:
    """How one provider is probed."""

    name: str
    edge_path: str
    inference_path: str
    default_model: str
    needs_key: bool
    #: The headers that carry the key (and a version header some APIs require).
    auth: Callable[[str | None], tuple[tuple[str, str], ...]]
    #: The inference request's JSON body for a model.
    inference_body: Callable[[str], dict[str, Any]]

    def edge(self, key: str | None) -> ProbeCall:
        """The edge request: a model listing, which costs no tokens."""
        return ProbeCall("GET", self.edge_path, self.auth(key), None)

    def inference(self, model: str, key: str | None) -> ProbeCall:
        """The inference request: one output token at most, streamed."""
        headers = (*self.auth(key), ("Content-Type", "application/json"))
        body = json.dumps(self.inference_body(model)).encode()
        return ProbeCall("POST", self.inference_path, headers, body)


def _bearer(key: str | None) -> tuple[tuple[str, str], ...]:
    return () if key is None else (("Authorization", f"Bearer {key}"),)


def _anthropic_auth(key: str | None) -> tuple[tuple[str, str], ...]:
    version = ("anthropic-version", "2023-06-01")
    return (version,) if key is None else (("x-api-key", key), version)


def _chat(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": _PROMPT}],
        "max_completion_tokens": MAX_OUTPUT_TOKENS,
        "stream": True,
    }


def _messages(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": _PROMPT}],
        "max_tokens": MAX_OUTPUT_TOKENS,
        "stream": True,
    }


def _ollama(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": _PROMPT}],
        "options": {"num_predict": MAX_OUTPUT_TOKENS},
        "stream": True,
    }


#: The provider profiles a config file may name.
PROFILES: Final[dict[str, MonitorProfile]] = {
    "openai": MonitorProfile(
        "openai", "/models", "/chat/completions", "gpt-4o-mini", True, _bearer, _chat
    ),
    # OpenAI-compatible servers (vLLM, gateways, Groq, Mistral's chat API): the same requests;
    # a key only when the server wants one.
    "openai-compatible": MonitorProfile(
        "openai-compatible", "/models", "/chat/completions", "default", False, _bearer, _chat
    ),
    "anthropic": MonitorProfile(
        "anthropic",
        "/models",
        "/messages",
        "claude-haiku-4-5",
        True,
        _anthropic_auth,
        _messages,
    ),
    "ollama": MonitorProfile(
        "ollama", "/api/tags", "/api/chat", "llama3.2", False, _bearer, _ollama
    ),
}
