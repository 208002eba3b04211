"""``LLMLatencyInstrumentor``: the OpenTelemetry instrumentor that installs the adapters."""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Collection, Iterable
from typing import Any, Protocol

from opentelemetry import metrics, trace
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from llm_latency.emitter import Emitter
from llm_latency.headers import resolve_capture_list
from llm_latency.version import __version__

_logger = logging.getLogger(__name__)

SCOPE_NAME = "llm_latency"


class Adapter(Protocol):
    """What the instrumentor needs of a client adapter."""

    name: str

    def install(self) -> None: ...

    def uninstall(self) -> None: ...


# client name -> (module whose presence means the client is installed, adapter "module:Class")
CLIENTS: dict[str, tuple[str, str]] = {
    "aiohttp": ("aiohttp", "llm_latency.adapters.aiohttp:AiohttpAdapter"),
    "httpx": ("httpcore", "llm_latency.adapters.httpcore:HttpxAdapter"),
    "httpx2": ("httpcore2", "llm_latency.adapters.httpcore:Httpx2Adapter"),
    "requests": ("urllib3", "llm_latency.adapters.requests:RequestsAdapter"),
}

# SDKs whose calls get one logical parent span around their retries (always, when installed).
SDKS: dict[str, tuple[str, str]] = {
    "openai": ("openai", "llm_latency.adapters.sdks:OpenAIAdapter"),
    "anthropic": ("anthropic", "llm_latency.adapters.sdks:AnthropicAdapter"),
}


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def select_clients(clients: Iterable[str] | None) -> list[str]:
    """The client names to instrument: those asked for (all must be installed), or every one
    installed. Raises ValueError for an unknown name or one that is not installed."""
    if clients is None:
        return [name for name, (module, _) in CLIENTS.items() if _installed(module)]
    if isinstance(clients, str):
        clients = [clients]
    chosen: list[str] = []
    for name in clients:
        if name not in CLIENTS:
            raise ValueError(
                f"llm-latency: unknown client {name!r}; supported: {', '.join(sorted(CLIENTS))}"
            )
        if not _installed(CLIENTS[name][0]):
            raise ValueError(f"llm-latency: client {name!r} is not installed")
        if name not in chosen:
            chosen.append(name)
    return chosen


def _load_adapter(target: str, emitter: Emitter) -> Adapter:
    module_name, _, class_name = target.partition(":")
    adapter_class = getattr(importlib.import_module(module_name), class_name)
    adapter: Adapter = adapter_class(emitter)
    return adapter


class LLMLatencyInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Phase-level tracing and metrics for the HTTP clients LLM SDKs use.

    ``instrument(tracer_provider=None, meter_provider=None, clients=None,
    capture_response_headers=(), phase_spans=True)``; registered under the
    ``opentelemetry_instrumentor`` entry point as ``llm_latency``.
    """

    _adapters: list[Adapter]
    emitter: Emitter | None = None

    def instrumentation_dependencies(self) -> Collection[str]:
        """None required: each client library is instrumented only when it is installed."""
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        tracer = trace.get_tracer(
            SCOPE_NAME, __version__, kwargs.get("tracer_provider"),
            schema_url="https://opentelemetry.io/schemas/1.37.0",
        )  # fmt: skip
        meter = metrics.get_meter(
            SCOPE_NAME, __version__, kwargs.get("meter_provider"),
            schema_url="https://opentelemetry.io/schemas/1.37.0",
        )  # fmt: skip
        emitter = Emitter(
            tracer,
            meter,
            capture_headers=resolve_capture_list(kwargs.get("capture_response_headers") or ()),
            phase_spans=bool(kwargs.get("phase_spans", True)),
        )
        self.emitter = emitter
        self._adapters = []
        try:
            targets = [CLIENTS[name][1] for name in select_clients(kwargs.get("clients"))]
            targets += [target for module, target in SDKS.values() if _installed(module)]
            for target in targets:
                adapter = _load_adapter(target, emitter)
                adapter.install()
                self._adapters.append(adapter)
        except BaseException:
            self._uninstrument()
            raise

    def _uninstrument(self, **kwargs: Any) -> None:
        adapters = getattr(self, "_adapters", [])
        while adapters:
            adapters.pop().uninstall()
        if self.emitter is not None:
            self.emitter.finish_all()
        self.emitter = None
