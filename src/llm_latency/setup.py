"""``configure=True``: SDK providers that export OTLP as the standard ``OTEL_*`` variables say.

Used only when the program has not set an SDK provider itself; a provider set globally (by the
program or by ``opentelemetry-instrument``) is always used as it is.
"""

from __future__ import annotations

import logging
import os

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

_logger = logging.getLogger(__name__)


def _protocol(signal: str) -> str:
    return (
        os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()


def _exporter_names(variable: str) -> list[str]:
    value = os.environ.get(variable, "otlp")
    return [name.strip().lower() for name in value.split(",") if name.strip()]


def span_exporter(name: str) -> SpanExporter | None:
    """The span exporter an ``OTEL_TRACES_EXPORTER`` name stands for (otlp, console)."""
    if name == "console":
        return ConsoleSpanExporter()
    if name != "otlp":
        _logger.warning("llm-latency: unsupported OTEL_TRACES_EXPORTER %r ignored", name)
        return None
    if _protocol("TRACES") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcSpanExporter,
        )

        return GrpcSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def metric_exporter(name: str) -> MetricExporter | None:
    """The metric exporter an ``OTEL_METRICS_EXPORTER`` name stands for (otlp, console)."""
    if name == "console":
        return ConsoleMetricExporter()
    if name != "otlp":
        _logger.warning("llm-latency: unsupported OTEL_METRICS_EXPORTER %r ignored", name)
        return None
    if _protocol("METRICS") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter as GrpcMetricExporter,
        )

        return GrpcMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter()


def _sdk_disabled() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def tracer_provider_is_set() -> bool:
    """Whether a real tracer provider has been set globally (not the default proxy)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def meter_provider_is_set() -> bool:
    """Whether a real meter provider has been set globally (not the default proxy)."""
    return type(metrics.get_meter_provider()).__name__ != "_ProxyMeterProvider"


def configure_providers(*, traces: bool = True, metrics_: bool = True) -> tuple[bool, bool]:
    """Set global SDK providers where none is set (only for the signals asked for).

    Returns whether the (trace, metric) providers were set up.
    """
    if _sdk_disabled():
        return False, False
    resource = Resource.create()
    traces_done = metrics_done = False
    if traces and not tracer_provider_is_set():
        tracer_provider = TracerProvider(resource=resource)
        for name in _exporter_names("OTEL_TRACES_EXPORTER"):
            if name == "none":
                continue
            spans_out = span_exporter(name)
            if spans_out is not None:
                tracer_provider.add_span_processor(BatchSpanProcessor(spans_out))
        trace.set_tracer_provider(tracer_provider)
        traces_done = True
    if metrics_ and not meter_provider_is_set():
        readers: list[MetricReader] = []
        for name in _exporter_names("OTEL_METRICS_EXPORTER"):
            if name == "none":
                continue
            metrics_out = metric_exporter(name)
            if metrics_out is not None:
                readers.append(PeriodicExportingMetricReader(metrics_out))
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))
        metrics_done = True
    return traces_done, metrics_done
