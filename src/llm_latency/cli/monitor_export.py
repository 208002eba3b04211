"""What ``llm-latency watch`` exports: the probes' spans (llm-latency's own request and phase
spans, tagged with the endpoint, the probe kind and the labels) and the probe metrics, over OTLP
when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, and for Prometheus to scrape when asked.

Edge and inference series are never mixed: every probe metric carries the kind.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider

import llm_latency
from llm_latency import semconv
from llm_latency.cli.errors import CLIError
from llm_latency.cli.telemetry import add_otlp, otlp_endpoint

PROBE_ENDPOINT: Final = semconv.PROBE_ENDPOINT
PROBE_KIND: Final = semconv.PROBE_KIND
PROBE_DURATION: Final = "llm_latency.probe.duration"
PROBE_TIME_TO_FIRST_BYTE: Final = "llm_latency.probe.time_to_first_byte"
#: An inference probe's first generated content (its one output token).
PROBE_TIME_TO_FIRST_TOKEN: Final = "llm_latency.probe.time_to_first_token"
PROBE_PHASE_DURATION: Final = "llm_latency.probe.phase.duration"
PROBE_RESULTS: Final = "llm_latency.probe.results"
PROBE_UP: Final = "llm_latency.probe.up"

#: The probe a span starts under: its endpoint, kind and labels, as span attributes.
PROBE_ATTRIBUTES: ContextVar[Mapping[str, str] | None] = ContextVar(
    "llm_latency_probe_attributes", default=None
)

Attributes = tuple[tuple[str, Any], ...]


class ProbeTagger(SpanProcessor):
    """Puts the current probe's endpoint, kind and labels on every span it starts: the request
    span, its phases, and the probe's own root span."""

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Tag ``span`` when it starts under a probe."""
        attributes = PROBE_ATTRIBUTES.get()
        if attributes is not None:
            span.set_attributes(dict(attributes))


class TraceSpans(SpanProcessor):
    """Keeps the finished spans of the traces it is told to watch, until they are taken."""

    def __init__(self) -> None:
        self._spans: dict[int, list[ReadableSpan]] = {}
        self._lock = threading.Lock()

    def watch(self, trace_id: int) -> None:
        """Keep the spans of ``trace_id`` from now on."""
        with self._lock:
            self._spans.setdefault(trace_id, [])

    def on_end(self, span: ReadableSpan) -> None:
        """Keep ``span`` if its trace is watched."""
        context = span.context
        if context is None:
            return
        with self._lock:
            kept = self._spans.get(context.trace_id)
            if kept is not None:
                kept.append(span)

    def take(self, trace_id: int) -> list[ReadableSpan]:
        """The finished spans of ``trace_id``; the trace is no longer watched."""
        with self._lock:
            return self._spans.pop(trace_id, [])


@dataclass
class Outcome:
    """One probe's result as metrics see it: ``ttfb`` and ``phases`` in seconds, ``status``
    and ``error`` (``error.type``) as the attempt ended, ``failed_phase`` where it failed."""

    attributes: Mapping[str, str]
    duration: float
    ttfb: float | None
    phases: Mapping[str, float]
    status: int | None
    error: str | None
    failed_phase: str | None
    #: An inference probe's time to its first token (s), when it streamed content.
    ttft: float | None = None

    @property
    def up(self) -> bool:
        """The endpoint answered, below 400."""
        return self.error is None and self.status is not None and self.status < 400


class ProbeMetrics:
    """The probe metrics, recorded once per probe."""

    def __init__(self, meter: Meter) -> None:
        buckets = semconv.DURATION_BUCKETS
        self._duration = meter.create_histogram(
            PROBE_DURATION,
            unit="s",
            description="A probe's request, from its start to the last byte (or the failure).",
            explicit_bucket_boundaries_advisory=buckets,
        )
        self._ttfb = meter.create_histogram(
            PROBE_TIME_TO_FIRST_BYTE,
            unit="s",
            description="A probe's time from the request's start to the first response byte.",
            explicit_bucket_boundaries_advisory=buckets,
        )
        self._ttft = meter.create_histogram(
            PROBE_TIME_TO_FIRST_TOKEN,
            unit="s",
            description="An inference probe's time from the request's start to its first "
            "generated token.",
            explicit_bucket_boundaries_advisory=buckets,
        )
        self._phase = meter.create_histogram(
            PROBE_PHASE_DURATION,
            unit="s",
            description="Time a probe's request spent in each phase.",
            explicit_bucket_boundaries_advisory=buckets,
        )
        self._results: dict[Attributes, int] = {}
        self._up: dict[Attributes, int] = {}
        self._lock = threading.Lock()
        meter.create_observable_counter(
            PROBE_RESULTS,
            [self._observe(self._results)],
            unit="{probe}",
            description="Probes, by outcome: the status code, or the error type and phase.",
        )
        meter.create_observable_gauge(
            PROBE_UP,
            [self._observe(self._up)],
            description="1 when the endpoint's last probe of this kind got an answer below 400.",
        )

    def _observe(
        self, values: dict[Attributes, int]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            with self._lock:
                items = list(values.items())
            return [Observation(value, dict(key)) for key, value in items]

        return observe

    def record(self, outcome: Outcome) -> None:
        """Record one probe."""
        base = dict(outcome.attributes)
        self._duration.record(outcome.duration, base)
        if outcome.ttfb is not None:
            self._ttfb.record(outcome.ttfb, base)
        if outcome.ttft is not None:
            self._ttft.record(outcome.ttft, base)
        for phase, seconds in outcome.phases.items():
            self._phase.record(seconds, {**base, semconv.PHASE: phase})
        result = dict(base)
        if outcome.status is not None:
            result[semconv.HTTP_RESPONSE_STATUS_CODE] = str(outcome.status)
        if outcome.error is not None:
            result[semconv.ERROR_TYPE] = outcome.error
        if outcome.failed_phase is not None:
            result[semconv.FAILED_PHASE] = outcome.failed_phase
        key = tuple(sorted(base.items()))
        with self._lock:
            result_key = tuple(sorted(result.items()))
            self._results[result_key] = self._results.get(result_key, 0) + 1
            self._up[key] = 1 if outcome.up else 0


@dataclass
class Telemetry:
    """The probe's providers and what reads them back."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    spans: TraceSpans
    metrics: ProbeMetrics


def _prometheus_reader(address: tuple[str, int]) -> tuple[MetricReader, Callable[[], None]]:
    """A reader served at ``http://HOST:PORT/metrics``, and what stops the server."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import REGISTRY, start_http_server

    try:
        server, thread = start_http_server(address[1], addr=address[0], registry=REGISTRY)
    except OSError as exc:
        raise CLIError(
            f"cannot serve metrics on {address[0]}:{address[1]}: {exc.strerror or exc}"
        ) from None
    reader = PrometheusMetricReader()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return reader, stop


@contextmanager
def probe_telemetry(
    service: str,
    prometheus: tuple[str, int] | None = None,
    extra_readers: Iterable[MetricReader] = (),
) -> Iterator[Telemetry]:
    """Instrument aiohttp for the probes; export over OTLP when the environment says so, and
    serve the metrics for Prometheus at ``prometheus`` (host, port) when given. On exit, the
    last spans and metrics are exported (providers shut down)."""
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service)})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(ProbeTagger())
    spans = TraceSpans()
    tracer_provider.add_span_processor(spans)
    readers: list[MetricReader] = list(extra_readers)
    if otlp_endpoint():
        readers += add_otlp(tracer_provider, None)
    stop_server: Callable[[], None] | None = None
    if prometheus is not None:
        reader, stop_server = _prometheus_reader(prometheus)
        readers.append(reader)
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    metrics = ProbeMetrics(meter_provider.get_meter(semconv.SCOPE_NAME + ".probe"))
    llm_latency.instrument(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        clients=["aiohttp"],
        configure=False,
        phase_spans=True,  # what the reports are made of, whatever the environment says
    )
    try:
        yield Telemetry(tracer_provider, meter_provider, spans, metrics)
    finally:
        llm_latency.uninstrument()
        tracer_provider.shutdown()
        meter_provider.shutdown()
        if stop_server is not None:
            stop_server()
