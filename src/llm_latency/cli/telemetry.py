"""The CLI's own telemetry: llm-latency instruments the CLI's clients; spans are collected in
memory for the report and, when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, also exported over OTLP
(so a running deploy bundle fills up)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import llm_latency
from llm_latency.cli.results import SpanCollector
from llm_latency.setup import metric_exporters, span_exporters


def otlp_endpoint() -> str | None:
    """Where OTLP goes, if the environment says so."""
    return os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )


class Collected(NamedTuple):
    """What the CLI reads back: the spans, and the metrics on demand."""

    spans: SpanCollector
    metrics: InMemoryMetricReader
    #: The provider of llm-latency's spans: the CLI's own spans (the demo's scenes) go there.
    tracer_provider: TracerProvider


def add_otlp(tracer_provider: TracerProvider, interval_ms: float | None) -> list[MetricReader]:
    """Export ``tracer_provider``'s spans over OTLP; the metric readers that export over OTLP
    (every ``interval_ms``; None: ``OTEL_METRIC_EXPORT_INTERVAL``, else the SDK's 60 s)."""
    for spans_out in span_exporters(["otlp"]):
        tracer_provider.add_span_processor(BatchSpanProcessor(spans_out))
    readers: list[MetricReader] = []
    for metrics_out in metric_exporters(["otlp"]):
        if isinstance(metrics_out, MetricReader):
            readers.append(metrics_out)
        else:
            readers.append(PeriodicExportingMetricReader(metrics_out, interval_ms))
    return readers


@contextmanager
def instrumented(service: str, clients: list[str]) -> Iterator[Collected]:
    """Instrument ``clients`` for the duration; yield the in-memory span collector and a
    metric reader to collect from."""
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service)})
    tracer_provider = TracerProvider(resource=resource)
    collector = SpanCollector()
    tracer_provider.add_span_processor(collector)
    in_memory = InMemoryMetricReader()
    readers: list[MetricReader] = [in_memory]
    if otlp_endpoint():
        readers += add_otlp(tracer_provider, 5000)
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    llm_latency.instrument(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        clients=clients,
        configure=False,
        phase_spans=True,  # what the reports are made of, whatever the environment says
    )
    try:
        yield Collected(collector, in_memory, tracer_provider)
    finally:
        llm_latency.uninstrument()
        tracer_provider.shutdown()
        meter_provider.shutdown()
