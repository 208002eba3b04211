"""The openai and anthropic SDKs: one logical parent per SDK call.

Their clients retry inside one call (``SyncAPIClient.request`` / ``AsyncAPIClient.request`` hold
the retry loop). Wrapping that method gives the call's attempts, and the ``retry.backoff`` waits
between them, one parent span named ``{sdk} {METHOD} {path}``, even when the program has no span
of its own; when a GenAI span (from ``opentelemetry-instrumentation-openai-v2``, say) is already
current, it is the parent instead. The HTTP attempts themselves come from the httpx2 (or aiohttp)
adapter.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry import context
from opentelemetry.trace import set_span_in_context

from llm_latency import semconv as sc
from llm_latency.adapters._patching import Patches
from llm_latency.calls import LogicalCall, current_call
from llm_latency.emitter import Emitter
from llm_latency.suppression import tracing_allowed


class SdkAdapter:
    """Patches one SDK's request methods (``openai`` or ``anthropic``)."""

    def __init__(self, emitter: Emitter, sdk: str) -> None:
        self.name = sdk
        self._emitter = emitter
        self._patches = Patches()

    def install(self) -> None:
        """Wrap the sync and async clients' ``request``."""
        base = importlib.import_module(f"{self.name}._base_client")
        p = self._patches
        p.replace(base.SyncAPIClient, "request", self._wrap_sync(base.SyncAPIClient.request))
        p.replace(base.AsyncAPIClient, "request", self._wrap_async(base.AsyncAPIClient.request))

    def uninstall(self) -> None:
        """Undo the patches."""
        self._patches.restore()

    def _enter(self, options: Any) -> tuple[LogicalCall, Any, Any] | None:
        if not tracing_allowed():
            return None
        try:
            method = str(getattr(options, "method", "")).upper()
            name = f"{self.name} {method} {getattr(options, 'url', '')}".strip()
            call = self._emitter.open_call(name, {sc.SDK: self.name})
        except Exception:
            self._emitter.failed_once(f"{self.name} call")
            return None
        token = current_call.set(call)
        attached = context.attach(set_span_in_context(call.span)) if call.span else None
        return call, token, attached

    def _exit(self, entered: tuple[LogicalCall, Any, Any], error: BaseException | None) -> None:
        call, token, attached = entered
        if attached is not None:
            context.detach(attached)
        current_call.reset(token)
        self._emitter.close_call(call, error)

    def _wrap_sync(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def request(client: Any, cast_to: Any, options: Any, *args: Any, **kwargs: Any) -> Any:
            entered = self._enter(options)
            if entered is None:
                return original(client, cast_to, options, *args, **kwargs)
            try:
                result = original(client, cast_to, options, *args, **kwargs)
            except BaseException as exc:
                self._exit(entered, exc)
                raise
            self._exit(entered, None)
            return result

        return request

    def _wrap_async(self, original: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        async def request(
            client: Any, cast_to: Any, options: Any, *args: Any, **kwargs: Any
        ) -> Any:
            entered = self._enter(options)
            if entered is None:
                return await original(client, cast_to, options, *args, **kwargs)
            try:
                result = await original(client, cast_to, options, *args, **kwargs)
            except BaseException as exc:
                self._exit(entered, exc)
                raise
            self._exit(entered, None)
            return result

        return request


class OpenAIAdapter(SdkAdapter):
    """The openai SDK."""

    def __init__(self, emitter: Emitter) -> None:
        super().__init__(emitter, "openai")


class AnthropicAdapter(SdkAdapter):
    """The anthropic SDK."""

    def __init__(self, emitter: Emitter) -> None:
        super().__init__(emitter, "anthropic")
