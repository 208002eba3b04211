"""A stand-in for the OpenTelemetry Collector's ``prometheus`` exporter (collector contrib
0.159), for tests/test_deploy_created_timestamps.py: it serves what an OpenTelemetry SDK's
metric reader holds, as that exporter would serve it to Prometheus.

What it copies from the exporter's source (open-telemetry/opentelemetry-collector-contrib,
exporter/prometheusexporter):

- collector.go: a monotonic sum becomes a counter, a histogram a classic histogram, each with
  the data point's start time as its created timestamp (client_golang's
  ``NewConstMetricWithCreatedTimestamp`` and ``NewConstHistogramWithCreatedTimestamp``, since
  contrib PR #34596) and with its exemplars (``trace_id``, ``span_id``); other sums and gauges
  become gauges. ``job`` and ``instance`` come from ``service.name`` and
  ``service.instance.id``; the scope is in ``otel_scope_name`` and ``otel_scope_version``.
- prometheus.go: the response is written by client_golang's ``promhttp`` with
  ``EnableOpenMetrics`` and nothing else, so the format is the first one the scraper's Accept
  header prefers among the Prometheus protobuf format (delimited), OpenMetrics text and the
  text format; the created timestamp is in the protobuf format only (OpenMetrics ``_created``
  lines need ``EnableOpenMetricsTextCreatedSamples``, which the exporter does not set).

Names follow ``translation_strategy: UnderscoreEscapingWithSuffixes``: dots to underscores, a
``_seconds`` suffix for the unit ``s``, ``_total`` on counters.
"""

from __future__ import annotations

import math
import struct
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.sdk.metrics.export import (
    Gauge,
    Histogram,
    HistogramDataPoint,
    InMemoryMetricReader,
    MetricsData,
    Sum,
)
from opentelemetry.sdk.metrics.export import Metric as OtelMetric

PROTOBUF = (
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
)
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT = "text/plain; version=0.0.4; charset=utf-8"

# io.prometheus.client.MetricType
COUNTER, GAUGE, HISTOGRAM = 0, 1, 4


#: An exemplar: its labels (trace_id, span_id), value and time in nanoseconds.
Exemplar = tuple[dict[str, str], float, int]


@dataclass
class Series:
    """One metric point, translated: its labels, and its value or its histogram."""

    labels: dict[str, str]
    value: float = 0.0  # a histogram's sum
    created_ns: int = 0
    count: int = 0
    buckets: tuple[tuple[float, int, Exemplar | None], ...] = ()  # (le, cumulative, exemplar)
    exemplar: Exemplar | None = None


@dataclass
class Family:
    name: str  # without _total; counters get it in the exposition
    help: str
    type: int
    series: list[Series]


# -- translation ---------------------------------------------------------------------------------


def _label_name(key: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in key)


def _label_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _family_name(metric: OtelMetric) -> str:
    name = _label_name(metric.name)
    if metric.unit == "s":
        name += "_seconds"
    return name


def _exemplar(exemplar: Any) -> Exemplar:
    labels = {}
    if exemplar.trace_id:
        labels["trace_id"] = format(exemplar.trace_id, "032x")
    if exemplar.span_id:
        labels["span_id"] = format(exemplar.span_id, "016x")
    return labels, float(exemplar.value), int(exemplar.time_unix_nano)


def _histogram_buckets(point: HistogramDataPoint) -> tuple[tuple[float, int, Any], ...]:
    """Cumulative buckets; an exemplar goes to the first bucket that holds its value, as
    client_golang's NewMetricWithExemplars places it."""
    exemplars = sorted(point.exemplars or (), key=lambda e: float(e.value))
    buckets = []
    cumulative = 0
    # bucket_counts has one more entry, the +Inf bucket, which is the point's count.
    for bound, count in zip(point.explicit_bounds, point.bucket_counts[:-1], strict=True):
        cumulative += count
        inside = [e for e in exemplars if e.value <= bound]
        exemplars = exemplars[len(inside) :]
        buckets.append((float(bound), cumulative, _exemplar(inside[-1]) if inside else None))
    return tuple(buckets)


def families(data: MetricsData | None) -> list[Family]:
    """The reader's metrics as the exporter exposes them (collector.go, convertMetric)."""
    result: dict[str, Family] = {}
    for resource_metrics in data.resource_metrics if data else ():
        resource = resource_metrics.resource.attributes
        job = str(resource.get("service.name", ""))
        if namespace := resource.get("service.namespace"):
            job = f"{namespace}/{job}"
        instance = str(resource.get("service.instance.id", ""))
        for scope_metrics in resource_metrics.scope_metrics:
            scope = {
                "otel_scope_name": scope_metrics.scope.name,
                "otel_scope_version": scope_metrics.scope.version or "",
            }
            for metric in scope_metrics.metrics:
                name = _family_name(metric)
                kind = GAUGE
                if isinstance(metric.data, Histogram):
                    kind = HISTOGRAM
                elif isinstance(metric.data, Sum) and metric.data.is_monotonic:
                    kind = COUNTER
                elif not isinstance(metric.data, (Sum, Gauge)):
                    continue
                family = result.setdefault(name, Family(name, metric.description or "", kind, []))
                for point in metric.data.data_points:
                    labels = {
                        _label_name(k): _label_value(v) for k, v in (point.attributes or {}).items()
                    }
                    labels |= {k: v for k, v in scope.items() if v}
                    labels |= {k: v for k, v in (("job", job), ("instance", instance)) if v}
                    if isinstance(point, HistogramDataPoint):
                        family.series.append(
                            Series(
                                labels,
                                value=point.sum,
                                created_ns=point.start_time_unix_nano,
                                count=point.count,
                                buckets=_histogram_buckets(point),
                            )
                        )
                    else:
                        exemplars = point.exemplars or ()
                        family.series.append(
                            Series(
                                labels,
                                value=float(point.value),
                                created_ns=point.start_time_unix_nano or 0,
                                exemplar=_exemplar(exemplars[-1]) if exemplars else None,
                            )
                        )
    return list(result.values())


# -- the Prometheus protobuf format (io.prometheus.client, metrics.proto) ---------------------


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        byte, number = number & 0x7F, number >> 7
        out.append(byte | (0x80 if number else 0))
        if not number:
            return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _uint(field: int, number: int) -> bytes:
    return _key(field, 0) + _varint(number)


def _double(field: int, number: float) -> bytes:
    return _key(field, 1) + struct.pack("<d", number)


def _message(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + _varint(len(payload)) + payload


def _string(field: int, text: str) -> bytes:
    return _message(field, text.encode())


def _timestamp(field: int, nanoseconds: int) -> bytes:
    seconds, nanos = divmod(nanoseconds, 1_000_000_000)
    return _message(field, _uint(1, seconds) + _uint(2, nanos))


def _label_pairs(field: int, labels: dict[str, str]) -> bytes:
    return b"".join(
        _message(field, _string(1, name) + _string(2, value))
        for name, value in sorted(labels.items())
    )


def _exemplar_message(field: int, labels: dict[str, str], value: float, time_ns: int) -> bytes:
    return _message(field, _label_pairs(1, labels) + _double(2, value) + _timestamp(3, time_ns))


def _metric_message(family: Family, series: Series) -> bytes:
    body = _label_pairs(1, series.labels)
    if family.type == COUNTER:
        # Counter: value = 1, exemplar = 2, created_timestamp = 3
        counter = _double(1, series.value)
        if series.exemplar:
            counter += _exemplar_message(2, *series.exemplar)
        if series.created_ns:
            counter += _timestamp(3, series.created_ns)
        return body + _message(3, counter)
    if family.type == HISTOGRAM:
        # Histogram: sample_count = 1, sample_sum = 2, bucket = 3, created_timestamp = 15;
        # Bucket: cumulative_count = 1, upper_bound = 2, exemplar = 3
        histogram = _uint(1, series.count) + _double(2, series.value)
        for bound, cumulative, exemplar in series.buckets:
            bucket = _uint(1, cumulative) + _double(2, bound)
            if exemplar is not None:
                bucket += _exemplar_message(3, *exemplar)
            histogram += _message(3, bucket)
        if series.created_ns:
            histogram += _timestamp(15, series.created_ns)
        return body + _message(7, histogram)
    return body + _message(2, _double(1, series.value))  # Gauge: value = 1


def protobuf(families: Iterable[Family]) -> bytes:
    """Length-delimited MetricFamily messages (name = 1, help = 2, type = 3, metric = 4)."""
    out = bytearray()
    for family in families:
        name = family.name + ("_total" if family.type == COUNTER else "")
        message = _string(1, name) + _string(2, family.help) + _uint(3, family.type)
        message += b"".join(_message(4, _metric_message(family, s)) for s in family.series)
        out += _varint(len(message)) + message
    return bytes(out)


# -- the text formats ----------------------------------------------------------------------------


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _labels_text(labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}" if inner else ""


def text(families: Iterable[Family], openmetrics: bool) -> bytes:
    """OpenMetrics 1.0 (with exemplars, without ``_created``), or the text format 0.0.4."""
    kinds = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}
    lines = []
    for family in families:
        total = "_total" if family.type == COUNTER else ""
        lines.append(f"# HELP {family.name}{'' if openmetrics else total} {family.help}")
        lines.append(f"# TYPE {family.name}{'' if openmetrics else total} {kinds[family.type]}")
        for series in family.series:
            if family.type != HISTOGRAM:
                line = f"{family.name}{total}{_labels_text(series.labels)} {_number(series.value)}"
                if openmetrics and series.exemplar:
                    labels, value, _ = series.exemplar
                    line += f" # {_labels_text(labels)} {_number(value)}"
                lines.append(line)
                continue
            for bound, cumulative, exemplar in (*series.buckets, (math.inf, series.count, None)):
                le = {**series.labels, "le": _number(bound)}
                line = f"{family.name}_bucket{_labels_text(le)} {cumulative}"
                if openmetrics and exemplar is not None:
                    line += f" # {_labels_text(exemplar[0])} {_number(exemplar[1])}"
                lines.append(line)
            lines.append(f"{family.name}_count{_labels_text(series.labels)} {series.count}")
            lines.append(f"{family.name}_sum{_labels_text(series.labels)} {_number(series.value)}")
    if openmetrics:
        lines.append("# EOF")
    return ("\n".join(lines) + "\n").encode()


# -- content negotiation and the server ----------------------------------------------------------


def _accepted(header: str) -> Iterator[tuple[str, dict[str, str]]]:
    """The Accept header's media types, most preferred first (by q, then by position)."""
    entries = []
    for position, part in enumerate(header.split(",")):
        media_type, *parameters = (p.strip() for p in part.split(";"))
        params = dict(p.split("=", 1) for p in parameters if "=" in p)
        entries.append((-float(params.pop("q", "1")), position, media_type.lower(), params))
    for _, _, media_type, params in sorted(entries):
        yield media_type, params


def negotiate(accept: str) -> str:
    """The format promhttp serves with EnableOpenMetrics (expfmt.NegotiateIncludingOpenMetrics):
    the first the scraper prefers among protobuf (delimited), OpenMetrics and text; text when
    none matches."""
    for media_type, params in _accepted(accept):
        if (
            media_type == "application/vnd.google.protobuf"
            and params.get("proto") == "io.prometheus.client.MetricFamily"
            and params.get("encoding") == "delimited"
        ):
            return PROTOBUF
        if media_type == "application/openmetrics-text":
            return OPENMETRICS
        if media_type == "text/plain":
            return TEXT
    return TEXT


class CollectorExporter:
    """The exposition server on 127.0.0.1. Like the collector, it serves what the program last
    sent: ``export()`` takes the reader's current metrics (the program's periodic export);
    ``served`` lists the format of every scrape."""

    def __init__(self, reader: InMemoryMetricReader) -> None:
        self.served: list[str] = []
        self.reader = reader
        self.exported: list[Family] = []
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                content_type = negotiate(self.headers.get("Accept", ""))
                found = exporter.exported
                if content_type == PROTOBUF:
                    body = protobuf(found)
                else:
                    body = text(found, openmetrics=content_type == OPENMETRICS)
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                exporter.served.append(content_type)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def export(self) -> None:
        self.exported = families(self.reader.get_metrics_data())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
