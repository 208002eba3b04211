"""A loopback OTLP/HTTP (protobuf) receiver that keeps what every process sent it: each span
(name, ids, attributes), the ``http.client.request.duration`` count, and any request to a path
that is not OTLP's.

The programs that count on ``duration_count`` export with delta temporality
(``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta``): each export then carries only
what is new, so the counts of all exports of all processes add up to the requests recorded.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

DURATION = "http.client.request.duration"


@dataclass(frozen=True)
class Span:
    name: str
    span_id: str
    parent_id: str | None
    attributes: dict[str, Any]
    trace_id: str = ""


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    return getattr(value, kind) if kind else None


def _duration_count(request: ExportMetricsServiceRequest) -> int:
    return sum(
        point.count
        for resource in request.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == DURATION
        for point in metric.histogram.data_points
    )


class OTLPReceiver:
    """Started at construction on a free loopback port; :meth:`stop` ends it."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        #: The sum of the ``http.client.request.duration`` data points' counts.
        self.duration_count = 0
        #: Paths of requests that were neither /v1/traces nor /v1/metrics.
        self.bad_requests: list[str] = []
        #: Every metrics export request, as received.
        self.metric_requests: list[ExportMetricsServiceRequest] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keeps the exporter's connection, as a collector does

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/traces":
                    receiver._traces(body)
                elif self.path == "/v1/metrics":
                    receiver._metrics(body)
                else:
                    receiver.bad_requests.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _traces(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        received = [
            Span(
                name=span.name,
                span_id=span.span_id.hex(),
                parent_id=span.parent_span_id.hex() or None,
                attributes={a.key: _value(a.value) for a in span.attributes},
                trace_id=span.trace_id.hex(),
            )
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]
        with self._lock:
            self.spans.extend(received)

    def _metrics(self, body: bytes) -> None:
        request = ExportMetricsServiceRequest()
        request.ParseFromString(body)
        count = _duration_count(request)
        with self._lock:
            self.duration_count += count
            self.metric_requests.append(request)

    def metric_exports(self) -> list[int]:
        """The ``http.client.request.duration`` count of each metrics export, in the order
        they arrived (one process's empty last export counts 0): what a test prints when the
        sum is not what it expected, to tell a process that never exported from one that
        exported fewer."""
        with self._lock:
            return [_duration_count(request) for request in self.metric_requests]

    @property
    def request_spans(self) -> Counter[str]:
        """Request span id (hex) -> how many times it was received."""
        with self._lock:
            return Counter(span.span_id for span in self.spans if "url.full" in span.attributes)

    def duplicated_spans(self) -> list[str]:
        """Request span ids received more than once."""
        return [span_id for span_id, times in self.request_spans.items() if times > 1]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
