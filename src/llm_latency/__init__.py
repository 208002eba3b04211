"""llm-latency: where the time of every LLM API call went, phase by phase, in OpenTelemetry.

Call :func:`instrument` once at start-up; :func:`flush` at the end of each invocation of a job
or serverless handler that freezes between invocations.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from llm_latency.early_spans import drop as drop_early_spans
from llm_latency.instrumentor import LLMLatencyInstrumentor
from llm_latency.lifecycle import flush, use_providers
from llm_latency.live_state import live_state
from llm_latency.retry import retry
from llm_latency.settings import resolve
from llm_latency.setup import configure_if_unset, hold_early_spans
from llm_latency.version import __version__

if TYPE_CHECKING:
    from llm_latency.diagnosis import Finding, diagnose

__all__ = [
    "Finding",
    "LLMLatencyInstrumentor",
    "__version__",
    "diagnose",
    "flush",
    "instrument",
    "live_state",
    "retry",
    "uninstrument",
]


def __getattr__(name: str) -> Any:
    """``diagnose`` and ``Finding``, imported at their first use: the diagnosis package (19
    modules, tens of milliseconds at start-up, objects that every full garbage collection
    walks) is for code that reads finished spans, not for the instrumented path."""
    if name in ("diagnose", "Finding"):
        from llm_latency import diagnosis

        value = getattr(diagnosis, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'llm_latency' has no attribute {name!r}")


def instrument(
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    clients: Iterable[str] | None = None,
    capture_response_headers: Iterable[str] | None = None,
    phase_spans: bool | None = None,
    phase_span_fast_path: bool | None = None,
    phase_metrics: Literal["setup", "all"] | None = None,
    configure: bool | None = None,
    time_per_output_chunk: bool | None = None,
    propagate: bool | None = None,
) -> None:
    """Trace every HTTP attempt of the installed clients, phase by phase, and record metrics.

    Every option left ``None`` is read from its environment variable
    (``OTEL_PYTHON_LLM_LATENCY_<OPTION>``; the response headers from the HTTP instrumentations'
    ``OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_RESPONSE``), else has the default given
    here (docs/configuration.md lists them): the same variables reach a program started by
    ``opentelemetry-instrument``. A bad argument raises ``ValueError``; a bad variable logs one
    warning line and the option keeps its default.

    Args:
        tracer_provider: where spans go; default the global provider.
        meter_provider: where metrics go; default the global provider.
        clients: names among ``aiohttp``, ``httpx``, ``httpx2`` and ``requests``; default every
            one installed. An unknown name raises ``ValueError``; one that is not installed is
            skipped with one warning line.
        capture_response_headers: response headers to record as ``http.response.header.*``
            besides the default allow-list. Credential and cookie headers are refused.
        phase_spans: emit one child span per phase (``http.dns``, ``http.wait``, ...); default
            True. With False, only the request span and the metrics are emitted.
        phase_span_fast_path: hand the spans llm-latency writes to the SDK's span processor
            as finished spans (default True): the phase spans that succeeded (about 3 µs each
            instead of 15; the sampler and span limits are not asked, a sampled request span is
            what a ParentBased sampler follows) and, while no span processor acts at a span's
            start, the request span (sampled as ``start_span`` samples it, written at its end:
            about half of a live span's cost). Span processors then see them in ``on_end``
            only. False sends every span through the public API.
        phase_metrics: the phases ``llm_latency.phase.duration`` records in-process.
            ``"setup"`` (the default): queue (when the attempt waited), dns, connect and tls,
            whose presence is itself the news; send, wait and receive are on the phase spans,
            and the Collector's span metrics give their distributions. ``"all"``: every phase,
            for a program that exports no spans.
        configure: if, at the first instrumented request, the program has set up neither a
            tracer provider nor a meter provider (and passed none here), set up the
            OpenTelemetry SDK from the ``OTEL_*`` variables (exporters by name, default OTLP
            over HTTP); default True. Any provider set before then, in any order, is used
            instead. The program's own spans started before then are kept, and exported when
            llm-latency sets the SDK up.
        time_per_output_chunk: also record ``gen_ai.client.operation.time_per_output_chunk``,
            one histogram record per body chunk of a streamed response after the first (off by
            default: it costs one SDK record per chunk; docs/overhead.md gives the measure).
        propagate: inject the trace context (``traceparent``, or what ``OTEL_PROPAGATORS``
            names) into each request, as OpenTelemetry does by default. False keeps it off
            the wire, for providers that must not see the program's trace ids or gateways that
            refuse unknown headers; the spans stay as they are.

    Calling it again while instrumented does nothing.
    """
    instrumentor = LLMLatencyInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        return
    # The parameters by name: every option (a test holds them equal to Settings' fields) and
    # the providers, which are no option (resolve reads only the options).
    settings = resolve(locals())
    configure_later = settings.configure and tracer_provider is None and meter_provider is None
    use_providers(tracer_provider, meter_provider)
    if configure_later:
        hold_early_spans()
    instrumentor._instrument_with(
        settings, configure_if_unset if configure_later else None, tracer_provider, meter_provider
    )


def uninstrument() -> None:
    """Restore every patched object. In-flight attempts still end and are emitted."""
    instrumentor = LLMLatencyInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()
        use_providers(None, None)
        drop_early_spans()
