"""A loopback OTLP/HTTP (protobuf) receiver that counts what every process sent it: the
request spans (by span id, to see duplicates) and the ``http.client.request.duration`` count.

The programs that export to it use delta temporality
(``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta``): each export then carries only
what is new, so the counts of all exports of all processes add up to the requests recorded.
"""

from __future__ import annotations

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

DURATION = "http.client.request.duration"


class OTLPReceiver:
    """Started at construction on a free loopback port; :meth:`stop` ends it."""

    def __init__(self) -> None:
        #: Request span id (hex) -> how many times it was received.
        self.request_spans: Counter[str] = Counter()
        #: The sum of the ``http.client.request.duration`` data points' counts.
        self.duration_count = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/traces":
                    receiver._traces(body)
                elif self.path == "/v1/metrics":
                    receiver._metrics(body)
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
        ids = [
            span.span_id.hex()
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
            if any(attribute.key == "url.full" for attribute in span.attributes)
        ]
        with self._lock:
            self.request_spans.update(ids)

    def _metrics(self, body: bytes) -> None:
        request = ExportMetricsServiceRequest()
        request.ParseFromString(body)
        count = sum(
            point.count
            for resource in request.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == DURATION
            for point in metric.histogram.data_points
        )
        with self._lock:
            self.duration_count += count

    def duplicated_spans(self) -> list[str]:
        """Span ids received more than once."""
        return [span_id for span_id, times in self.request_spans.items() if times > 1]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
