"""``configure=True``: set up the OpenTelemetry SDK, but only when nothing else will.

The rule: llm-latency's tracer and meter follow the program's providers, whichever way they
are set (``instrument()`` before or after the program's own set-up, ``opentelemetry-instrument``,
explicit providers). Only if, at the **first instrumented request**, the program has set *no*
tracer provider and *no* meter provider (and passed none), does llm-latency set the SDK up
itself, from the standard ``OTEL_*`` variables:

- exporters by name from ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` (default
  ``otlp``), looked up under the SDK's entry points (``opentelemetry_traces_exporter``, ...),
  so console, otlp, zipkin, prometheus or any registered exporter works; ``otlp`` means
  ``OTEL_EXPORTER_OTLP_PROTOCOL`` (default ``http/protobuf``, as the specification says);
- the resource, sampler and id generator as the SDK reads them (``OTEL_SERVICE_NAME``,
  ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ...); ``OTEL_SDK_DISABLED=true``
  turns it off.

A span the program starts before that request (its own span around its first call) is kept on
a provisional provider until then, and exported if llm-latency sets the SDK up (``early_spans``).

A collector that cannot be reached costs one warning line (the exporters' own repeated errors
are held back) and about a second at exit (the last export gets that long when exports are
failing or none has been confirmed yet). What the SDK holds is flushed at every end of the
process, forks included (``lifecycle``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace

from llm_latency import early_spans, forks, otel_internals

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

_logger = logging.getLogger(__name__)

_OTLP_BY_PROTOCOL = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}

_lock = forks.lock()
_decided = False

#: Called with the tracer provider, the meter provider and the export health once llm-latency
#: has set the SDK up: ``lifecycle.own``, registered at its import (this module sits below it).
WHEN_SET_UP: list[Callable[[Any, Any, Any], None]] = []


def tracer_provider_is_set() -> bool:
    """Whether a tracer provider has been set globally (not the API's default proxy)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def meter_provider_is_set() -> bool:
    """Whether a meter provider has been set globally (not the API's default proxy)."""
    return not otel_internals.is_proxy_meter_provider(metrics.get_meter_provider())


def _sdk_disabled() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def exporter_names(signal: str, requested: Sequence[str] | None = None) -> list[str]:
    """Entry-point names of the exporters asked for (default: what ``OTEL_{signal}_EXPORTER``
    says, else otlp), ``otlp`` resolved to its protocol's exporter."""
    if requested is None:
        requested = os.environ.get(f"OTEL_{signal.upper()}_EXPORTER", "otlp").split(",")
    names: list[str] = []
    for raw in requested:
        name = raw.strip().lower()
        if not name or name == "none":
            continue
        if name == "otlp":
            protocol = (
                os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf"
            ).strip()
            if protocol not in _OTLP_BY_PROTOCOL:
                raise ValueError(f"unsupported OTLP protocol {protocol!r}")
            name = _OTLP_BY_PROTOCOL[protocol]
        names.append(name)
    return names


def span_exporters(names: Sequence[str] | None = None) -> list[SpanExporter]:
    """Span exporters by entry-point name (default: as ``OTEL_TRACES_EXPORTER`` says)."""
    found, _ = otel_internals.exporter_classes(exporter_names("traces", names), [])
    return [exporter_class() for exporter_class in found.values()]


def metric_exporters(
    names: Sequence[str] | None = None,
) -> list[MetricExporter | MetricReader]:
    """Metric exporters (push) and readers (pull, such as prometheus) by entry-point name
    (default: as ``OTEL_METRICS_EXPORTER`` says)."""
    _, found = otel_internals.exporter_classes([], exporter_names("metrics", names))
    return [exporter_class() for exporter_class in found.values()]


def hold_early_spans() -> None:
    """The SDK may be set up at the first request: keep the program's spans started before it
    (``early_spans``), unless the decision is already taken or foregone."""
    with _lock:
        if _decided or _sdk_disabled() or tracer_provider_is_set():
            return
        early_spans.hold(_provisional_tracer_provider)


def configure_if_unset() -> None:
    """Set the SDK up as the module docstring says, once, if nothing else has. Never raises."""
    global _decided
    with _lock:
        if _decided:
            return
        _decided = True
        try:
            if _sdk_disabled() or tracer_provider_is_set() or meter_provider_is_set():
                return
            _configure_or_warn()
        finally:
            early_spans.drop()  # nothing held any more when llm-latency set the SDK up


def _configure_or_warn() -> None:
    try:
        _configure()
    except ImportError:
        _logger.warning(
            "llm-latency: no OpenTelemetry SDK is set up and none is installed, so "
            "llm-latency's spans and metrics go nowhere: install 'llm-latency[otlp]' (from a "
            "checkout: '.[otlp]') or set up your providers"
        )
    except Exception as exc:
        _logger.warning(
            "llm-latency: could not set up the OpenTelemetry SDK from OTEL_* (%s: %s); "
            "llm-latency's spans and metrics go nowhere: install 'llm-latency[otlp]' (from a "
            "checkout: '.[otlp]') for OTLP, or name installed exporters in "
            "OTEL_TRACES_EXPORTER and OTEL_METRICS_EXPORTER",
            type(exc).__name__,
            exc,
        )


def _tracer_provider(resource: Resource) -> TracerProvider:
    """A tracer provider as the SDK reads ``OTEL_*`` (sampler, id generator), with no span
    processor, flushed by ``lifecycle`` rather than at exit by itself."""
    from opentelemetry.sdk.trace import TracerProvider

    sampler, id_generator = otel_internals.sampler_and_id_generator()
    return TracerProvider(
        resource=resource, sampler=sampler, id_generator=id_generator, shutdown_on_exit=False
    )


def _provisional_tracer_provider() -> TracerProvider:
    from opentelemetry.sdk.resources import Resource

    return _tracer_provider(Resource.create())


def _configure() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from llm_latency.export_health import ExportHealth, QuietMetricExporter, QuietSpanExporter

    health = ExportHealth()
    # The held spans' resource, when the program started any: one resource for every span.
    resource = early_spans.resource() or Resource.create()
    tracer_provider = _tracer_provider(resource)
    processors = [
        BatchSpanProcessor(QuietSpanExporter(exporter, health)) for exporter in span_exporters()
    ]
    for processor in processors:
        tracer_provider.add_span_processor(processor)
    readers = [
        item
        if isinstance(item, MetricReader)
        else PeriodicExportingMetricReader(QuietMetricExporter(item, health))
        for item in metric_exporters()
    ]
    meter_provider = MeterProvider(
        resource=resource, metric_readers=readers, shutdown_on_exit=False
    )
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    early_spans.hand_over(processors)
    for hook in WHEN_SET_UP:
        hook(tracer_provider, meter_provider, health)
