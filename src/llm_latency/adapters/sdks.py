"""The openai and anthropic SDKs: one logical parent per SDK call.

Their clients retry inside one call (``SyncAPIClient.request`` / ``AsyncAPIClient.request`` hold
the retry loop). Hooking that method gives the call's attempts, and the ``retry.backoff`` waits
between them, one parent span named ``{sdk} {METHOD} {path}``, even when the program has no span
of its own; when a GenAI span (from ``opentelemetry-instrumentation-openai-v2``, say) is already
current, it is the parent instead. The HTTP attempts themselves come from the httpx2 (or aiohttp)
adapter.
"""

from __future__ import annotations

from typing import Any

from llm_latency import semconv
from llm_latency.adapters._patching import SKIP, Hook, PatchSet, Unavailable
from llm_latency.calls import LogicalCall, current_call
from llm_latency.emitter import Emitter
from llm_latency.suppression import tracing_allowed

_State = tuple[LogicalCall, Any, Any]


class SdkAdapter:
    """Hooks one SDK's request methods (``openai`` or ``anthropic``)."""

    def __init__(self, emitter: Emitter, sdk: str) -> None:
        self.name = sdk
        self._emitter = emitter
        self._patches = PatchSet(sdk, emitter.failed_once)
        self.lost: list[str] = self._patches.lost

    def install(self) -> None:
        """Hook the sync and async clients' ``request``."""
        hook = Hook(self._enter, self._returns, self._exit)
        base = f"{self.name}._base_client"
        if not self._patches.group(
            "one parent span per SDK call",
            [
                (f"{base}:SyncAPIClient", "request", hook),
                (f"{base}:AsyncAPIClient", "request", hook),
            ],
        ):
            raise Unavailable(self._patches.lost)

    def uninstall(self) -> None:
        """Undo the hooks."""
        self._patches.restore()

    def _enter(self, client: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not tracing_allowed():
            return SKIP
        options = args[1] if len(args) > 1 else kwargs.get("options")
        method = str(getattr(options, "method", "")).upper()
        name = f"{self.name} {method} {getattr(options, 'url', '')}".strip()
        call = self._emitter.open_call(name, {semconv.SDK: self.name})
        token = current_call.set(call)
        return call, token, self._emitter.enter_call(call)

    def _exit(self, state: _State, error: BaseException | None) -> None:
        call, token, attached = state
        self._emitter.exit_call(attached)
        current_call.reset(token)
        self._emitter.close_call(call, error)

    def _returns(self, state: _State, result: Any) -> Any:
        self._exit(state, None)
        return result


class OpenAIAdapter(SdkAdapter):
    """The openai SDK."""

    def __init__(self, emitter: Emitter) -> None:
        super().__init__(emitter, "openai")


class AnthropicAdapter(SdkAdapter):
    """The anthropic SDK."""

    def __init__(self, emitter: Emitter) -> None:
        super().__init__(emitter, "anthropic")
