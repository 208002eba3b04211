"""``LLMLatencyInstrumentor``: the OpenTelemetry instrumentor that installs the adapters.

Each client library is instrumented on its own: one that is missing, outside its supported
range, or changed beyond what an adapter can hook is skipped (or loses only the phases it can
no longer show) with one warning line, and the others are instrumented all the same.

A library is hooked when the program imports it (at once if it already has): ``instrument()``
never imports one itself. Importing the openai and anthropic SDKs costs more than a second and
thousands of modules, which a program that never uses them should not pay. Each such module has
one import hook for the life of the process (``import_hooks``), which installs what the
instrumentation live at the import waits for.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import sys
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict

from opentelemetry import metrics, trace
from opentelemetry.instrumentation.dependencies import (
    DependencyConflict,
    get_dependency_conflicts,
)
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from llm_latency import emitter as emitting
from llm_latency import forks, semconv
from llm_latency.adapters._patching import Unavailable, module_installed
from llm_latency.emitter import Emitter
from llm_latency.import_hooks import when_imported
from llm_latency.settings import Settings, genai_names, keywords, resolve
from llm_latency.setup import meter_provider_is_set
from llm_latency.version import __version__
from llm_latency.zero_code import warn_if_unconfigured

if TYPE_CHECKING:
    from typing import Unpack

_logger = logging.getLogger(__name__)


class Adapter(Protocol):
    """What the instrumentor needs of a client adapter."""

    name: str

    @property
    def lost(self) -> list[str]:
        """Capabilities this version of the library does not let the adapter observe."""
        ...

    def install(self) -> None: ...

    def uninstall(self) -> None: ...


#: Makes the adapter of one library, for an emitter.
AdapterFactory = Callable[[Emitter], Adapter]


@dataclass(frozen=True)
class Target:
    """A library llm-latency hooks: the module whose import installs the adapter, the
    distribution whose version decides, its supported range, and what makes the adapter.
    ``older_module``: the module to wait for instead when ``module`` does not exist (the
    library's layout before a rename)."""

    module: str
    requirement: str
    adapter: AdapterFactory
    older_module: str | None = None

    @property
    def distribution(self) -> str:
        return self.requirement.split()[0]

    def trigger(self) -> str | None:
        """The module whose import installs the adapter, if the library is installed."""
        for module in (self.module, self.older_module):
            if module is not None and module_installed(module):
                return module
        return None


# Each adapter module is imported when its library is: ``import llm_latency`` pays for none
# of them (the aiohttp and requests adapters import their library).


def _aiohttp(emitter: Emitter) -> Adapter:
    from llm_latency.adapters.aiohttp import AiohttpAdapter

    return AiohttpAdapter(emitter)


def _requests(emitter: Emitter) -> Adapter:
    from llm_latency.adapters.requests import RequestsAdapter

    return RequestsAdapter(emitter)


def _litellm(emitter: Emitter) -> Adapter:
    from llm_latency.adapters.litellm import LiteLLMAdapter

    return LiteLLMAdapter(emitter)


def _httpcore(module: str) -> AdapterFactory:
    """The adapter of ``httpcore`` or ``httpcore2``."""

    def make(emitter: Emitter) -> Adapter:
        from llm_latency.adapters.httpcore import HttpcoreAdapter

        return HttpcoreAdapter(emitter, module)

    return make


def _sdk(sdk: str) -> AdapterFactory:
    """The adapter of one SDK of ``adapters.sdks.SDK_CALLS``."""

    def make(emitter: Emitter) -> Adapter:
        from llm_latency.adapters.sdks import SdkAdapter

        return SdkAdapter(emitter, sdk)

    return make


#: Client name -> what it hooks. The ranges are the versions CI tests (oldest and newest).
CLIENTS: dict[str, Target] = {
    "aiohttp": Target("aiohttp", "aiohttp >= 3.12.11, < 4", _aiohttp),
    "httpx": Target("httpcore", "httpcore >= 1.0.9, < 2", _httpcore("httpcore")),
    "httpx2": Target("httpcore2", "httpcore2 >= 2.7, < 3", _httpcore("httpcore2")),
    "requests": Target("urllib3", "urllib3 >= 2.0.2, < 3", _requests),
}

#: SDKs whose calls get one logical parent span around their retries (always, when installed).
SDKS: dict[str, Target] = {
    "openai": Target("openai", "openai >= 3.0, < 4", _sdk("openai")),
    "anthropic": Target("anthropic", "anthropic >= 2.0, < 3", _sdk("anthropic")),
    "groq": Target("groq", "groq >= 1.0, < 2", _sdk("groq")),
    "google-genai": Target("google.genai", "google-genai >= 3.0, < 4", _sdk("google-genai")),
    # mistralai 2 and later are a namespace package (an import hook on it never runs) with
    # the SDK under mistralai.client; 1.x is the package itself.
    "mistralai": Target(
        "mistralai.client.basesdk",
        "mistralai >= 1.5, < 4",
        _sdk("mistralai"),
        older_module="mistralai",
    ),
    "cohere": Target("cohere", "cohere >= 7.0, < 8", _sdk("cohere")),
    # Bedrock's runtimes only (aiobotocore's AioBaseClient overrides the hooked method).
    "botocore": Target("botocore", "botocore >= 1.35, < 2", _sdk("botocore")),
    "litellm": Target("litellm", "litellm >= 1.83.0, < 2", _litellm),
}


def select_clients(clients: Iterable[str] | None) -> list[str]:
    """The client names to instrument: those asked for (``Settings`` checked the names), or
    every one installed. One asked for that is not installed is skipped with one warning line,
    as one out of its supported range is."""
    if clients is None:
        return [name for name, target in CLIENTS.items() if module_installed(target.module)]
    chosen: list[str] = []
    for name in clients:
        if not module_installed(CLIENTS[name].module):
            _logger.warning("llm-latency: %s is not instrumented: it is not installed", name)
        elif name not in chosen:
            chosen.append(name)
    return chosen


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _load(name: str, target: Target, emitter: Emitter) -> Adapter | None:
    """Install one adapter; on any reason not to, one warning and None."""
    conflict = get_dependency_conflicts([target.requirement])
    if conflict is not None:
        _logger.warning(
            'llm-latency: %s is not instrumented: it supports "%s", found "%s"',
            name,
            conflict.required,
            conflict.found or "none",
        )
        return None
    adapter: Adapter | None = None
    try:
        adapter = target.adapter(emitter)
        adapter.install()
    except Exception as exc:
        if adapter is not None:
            adapter.uninstall()
        reason = str(exc) if isinstance(exc, Unavailable) else f"{type(exc).__name__}: {exc}"
        _logger.warning(
            "llm-latency: %s %s is not instrumented (%s)",
            name,
            _version(target.distribution),
            reason,
        )
        return None
    if adapter.lost:
        _logger.warning(
            "llm-latency: %s %s is instrumented without %s",
            name,
            _version(target.distribution),
            "; ".join(adapter.lost),
        )
    return adapter


class InstrumentKwargs(TypedDict, total=False):
    """The keywords of ``LLMLatencyInstrumentor().instrument()``, typed as contrib's
    instrumentors type theirs: the providers, and the options of ``Settings`` that the
    instrumentor acts on, by ``instrument()``'s names (a test holds them equal)."""

    tracer_provider: TracerProvider | None
    meter_provider: MeterProvider | None
    clients: Iterable[str] | None
    capture_response_headers: Iterable[str] | None
    phase_spans: bool | None
    phase_span_fast_path: bool | None
    phase_metrics: Literal["setup", "all"] | None
    time_per_output_chunk: bool | None
    propagate: bool | None


class LLMLatencyInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Phase-level tracing and metrics for the HTTP clients LLM SDKs use; registered under the
    ``opentelemetry_instrumentor`` entry point as ``llm_latency``.

    ``instrument(**kwargs)`` takes ``tracer_provider`` and ``meter_provider`` (default the
    global ones) and the options of ``llm_latency.instrument()`` below, by the same names; one
    not given is read from its environment variable, else has its default
    (docs/configuration.md), which is how ``opentelemetry-instrument``, passing none, sets them.
    ``configure`` is ``llm_latency.instrument()``'s only: under ``opentelemetry-instrument``
    the distro sets the SDK up. The options:

    """

    _adapters: list[Adapter]
    emitter: Emitter | None = None
    #: The options of the live instrumentation (or of the last one).
    settings: Settings | None = None
    #: ``llm_latency.instrument()``'s Settings (built and checked there) and what runs before
    #: the first request, for the one ``_instrument`` it calls (:meth:`_instrument_with`):
    #: never a keyword of the public ``instrument(**kwargs)``.
    _handed: tuple[Settings, Callable[[], None] | None] | None = None
    #: The emitter of the live instrumentation, which imports install adapters for (None once
    #: uninstrumented).
    _live: Emitter | None = None
    #: Module -> the libraries whose adapter its import installs, for the live instrumentation.
    _waiting: dict[str, list[tuple[str, Target]]] = {}
    # Reentrant: installing one adapter may import another hooked library, whose import hook
    # then installs its adapter inside the first (botocore's hook imports botocore.client,
    # which imports urllib3 for the first time).
    _adapters_lock = forks.rlock()

    def instrumentation_dependencies(self) -> Collection[str]:
        """The supported range of every library llm-latency hooks. Any one of the clients is
        enough: one out of its range is skipped on its own, with the usual message."""
        return [target.requirement for target in (*CLIENTS.values(), *SDKS.values())]

    def _check_dependency_conflicts(self) -> DependencyConflict | None:
        conflicts = [get_dependency_conflicts([t.requirement]) for t in CLIENTS.values()]
        if any(conflict is None for conflict in conflicts):
            return None
        found = [conflict for conflict in conflicts if conflict is not None and conflict.found]
        return found[0] if found else conflicts[0]

    def _instrument_with(
        self,
        settings: Settings,
        before_first_request: Callable[[], None] | None,
        tracer_provider: TracerProvider | None,
        meter_provider: MeterProvider | None,
    ) -> None:
        """``llm_latency.instrument()``'s way in: ``instrument()`` with its bound ``settings``
        and its own set-up to run before the first request."""
        self._handed = (settings, before_first_request)
        try:
            self.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
        finally:
            self._handed = None

    def _instrument(self, **kwargs: Unpack[InstrumentKwargs]) -> None:
        tracer_provider = kwargs.get("tracer_provider")
        meter_provider = kwargs.get("meter_provider")
        handed, self._handed = self._handed, None
        if handed is not None:
            settings, before_first_request = handed
        else:
            settings = resolve(kwargs)
            # Without providers, opentelemetry-instrument started this: nothing here sets the
            # SDK up, and without a distro nothing else does either.
            own = tracer_provider or meter_provider
            before_first_request = None if own else warn_if_unconfigured
        chosen = [(name, CLIENTS[name]) for name in select_clients(settings.clients)]
        chosen += [(name, target) for name, target in SDKS.items() if target.trigger()]
        tracer = trace.get_tracer(
            semconv.SCOPE_NAME, __version__, tracer_provider, schema_url=semconv.SCHEMA_URL
        )
        # Never a meter of the API's proxy (see ``tracer_handle``): with no meter provider
        # given or set yet, the emitter takes the real meter once one is set.
        meter = (
            metrics.get_meter(
                semconv.SCOPE_NAME, __version__, meter_provider, schema_url=semconv.SCHEMA_URL
            )
            if meter_provider is not None or meter_provider_is_set()
            else None
        )
        emitter = Emitter(
            tracer,
            meter,
            settings,
            before_first_request=before_first_request,
            genai=genai_names(),
        )
        self.settings = settings
        self.emitter = self._live = emitting.active = emitter
        self._adapters = []
        waiting: dict[str, list[tuple[str, Target]]] = {}
        for name, target in chosen:
            module = target.trigger() or target.module
            if module in sys.modules:
                self._add(name, target, emitter)
            else:
                waiting.setdefault(module, []).append((name, target))
        with self._adapters_lock:
            self._waiting = waiting
        for module in waiting:  # a module imported since runs its hook at once
            when_imported(module, _imported)

    def _imported(self, module: str) -> None:
        """``module`` was imported: install the adapters the live instrumentation waits for."""
        with self._adapters_lock:
            emitter = self._live
            waiting = self._waiting.pop(module, [])
            if emitter is not None:
                for name, target in waiting:
                    self._add(name, target, emitter)

    def _add(self, name: str, target: Target, emitter: Emitter) -> None:
        with self._adapters_lock:
            if self._live is not emitter:
                return
            adapter = _load(name, target, emitter)
            if adapter is not None:
                self._adapters.append(adapter)

    def _uninstrument(self, **kwargs: Any) -> None:
        with self._adapters_lock:
            self._live = None
            self._waiting = {}
            adapters = getattr(self, "_adapters", [])
            while adapters:
                adapters.pop().uninstall()
        if self.emitter is not None:
            self.emitter.finish_all()
        self.emitter = emitting.active = None


LLMLatencyInstrumentor.__doc__ = f"{LLMLatencyInstrumentor.__doc__}{keywords()}\n    "


def _imported(module: ModuleType) -> None:
    """The one import hook of every module an instrumentation waits for: it holds nothing, and
    reads the instrumentation live when the module is imported."""
    LLMLatencyInstrumentor()._imported(module.__name__)
