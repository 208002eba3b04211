"""The exporters of an SDK that llm-latency set up itself (``setup``), kept quiet and brief.

An unreachable collector must not flood the program's log or hold up its exit: the exporters'
own log records are held back, the first failed export is reported in one warning line (with
the first held-back message as its detail), and at the end of the process the last export
gets ``lifecycle.EXIT_BUDGET_S`` unless exports are known to be working. None of this applies
to exporters the program set up: those are the program's to configure.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from llm_latency import otel_internals

_logger = logging.getLogger(__name__)


#: The longest warning line: it must say what to do, whole, not cut off mid-word.
MAX_WARNING = 159


def warning_line(signal: str, endpoint: str | None, detail: str | None) -> str:
    """The one line about a failed export (later errors are not logged): where it went, and
    what to do (run a collector there, or turn the exporter off), in under 160 characters; the
    exporter's own message is added only when it fits whole."""
    variable = "OTEL_TRACES_EXPORTER" if signal == "spans" else "OTEL_METRICS_EXPORTER"
    where = f" to {endpoint}" if endpoint else ""
    advice = f"run a collector there, or set {variable}=none"
    if len(where) > 60:  # an endpoint too long to keep the advice in the line
        where = ""
    line = f"llm-latency: could not export {signal}{where}: {advice}"
    if detail:
        with_detail = f"llm-latency: could not export {signal}{where} ({detail}): {advice}"
        if len(with_detail) <= MAX_WARNING:
            line = with_detail
    return line


class _HoldBack(logging.Filter):
    """Drops an exporter module's records, keeping the first warning's text for the report."""

    def __init__(self, health: ExportHealth) -> None:
        super().__init__()
        self._health = health

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING and self._health.detail is None:
            text = record.getMessage().splitlines()[0]
            self._health.detail = text if len(text) <= 200 else text[:199] + "…"
        return False


class ExportHealth:
    """Whether exports are working, shared by the quiet exporters of one set-up."""

    def __init__(self) -> None:
        self.detail: str | None = None
        self.closed = False
        self._working = False
        self._warned = False
        self._exporters: list[Any] = []
        self._filter = _HoldBack(self)

    def watch(self, exporter: Any) -> None:
        """Hold back the log records of the modules ``exporter``'s class is made of."""
        self._exporters.append(exporter)
        for cls in type(exporter).__mro__:
            module = cls.__module__
            if module in ("builtins", "abc") or module.startswith("opentelemetry.sdk"):
                continue
            logger = logging.getLogger(module)
            if self._filter not in logger.filters:
                logger.addFilter(self._filter)

    def record(self, signal: str, exporter: Any, ok: bool) -> None:
        """One export ended; the first failure is reported, once."""
        self._working = ok
        if ok or self._warned:
            return
        self._warned = True
        _logger.warning(
            "%s", warning_line(signal, otel_internals.exporter_endpoint(exporter), self.detail)
        )

    @property
    def working(self) -> bool:
        """Whether the last export went through."""
        return self._working

    def after_fork(self) -> None:
        """In a forked child: its exports are its own, and so is its report of a failure."""
        self.closed = False
        self._working = False
        self._warned = False
        self.detail = None

    def timed_out(self, budget_s: float) -> None:
        """A flush did not end within ``budget_s``: reported as a failed export, once."""
        if self._warned or self._working:
            return
        self._warned = True
        _logger.warning(
            "llm-latency: could not export within %.1f s%s; later export errors are not logged "
            "(llm-latency set up the OpenTelemetry SDK, since the program did not)",
            budget_s,
            f": {self.detail}" if self.detail else "",
        )

    def shut_down(
        self,
        tracer_provider: TracerProvider,
        meter_provider: MeterProvider,
        budget_s: float,
        working_budget_s: float,
    ) -> None:
        """At the end of the process: flush and shut both providers down, within ``budget_s``
        (``working_budget_s`` when exports are known to work); past it, the exporters are shut
        down and what is left is dropped."""
        worker = threading.Thread(
            target=_shut_down_providers,
            args=(tracer_provider, meter_provider),
            name="llm-latency-exit",
            daemon=True,
        )
        worker.start()
        worker.join(working_budget_s if self._working else budget_s)
        if not worker.is_alive():
            return
        self.closed = True
        for exporter in self._exporters:
            with contextlib.suppress(Exception):  # at exit, after a failure already reported
                exporter.shutdown()
        worker.join(0.2)


def _shut_down_providers(tracer_provider: TracerProvider, meter_provider: MeterProvider) -> None:
    try:
        tracer_provider.shutdown()
    finally:
        meter_provider.shutdown()


class QuietSpanExporter(SpanExporter):
    """A span exporter whose failures are reported once (see :class:`ExportHealth`)."""

    def __init__(self, inner: SpanExporter, health: ExportHealth) -> None:
        self._inner = inner
        self._health = health
        health.watch(inner)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export through the inner exporter, unless the exit gave up on it."""
        if self._health.closed:
            return SpanExportResult.FAILURE
        result = self._inner.export(spans)
        self._health.record("spans", self._inner, result is SpanExportResult.SUCCESS)
        return result

    def shutdown(self) -> None:
        """Shut the inner exporter down."""
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flush the inner exporter."""
        return self._inner.force_flush(timeout_millis)


class QuietMetricExporter(MetricExporter):
    """A metric exporter whose failures are reported once (see :class:`ExportHealth`)."""

    def __init__(self, inner: MetricExporter, health: ExportHealth) -> None:
        temporality, aggregation = otel_internals.exporter_preferences(inner)
        super().__init__(preferred_temporality=temporality, preferred_aggregation=aggregation)
        self._inner = inner
        self._health = health
        health.watch(inner)

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        """Export through the inner exporter, unless the exit gave up on it."""
        if self._health.closed:
            return MetricExportResult.FAILURE
        result = self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        self._health.record("metrics", self._inner, result is MetricExportResult.SUCCESS)
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Flush the inner exporter."""
        return self._inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Shut the inner exporter down."""
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)
