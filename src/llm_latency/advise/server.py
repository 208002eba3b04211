"""The findings service's HTTP server: OTLP/HTTP traces in, metrics, page and JSON out.

- ``POST /v1/traces``: an OTLP/HTTP export (protobuf or JSON, gzip or not), answered as the
  specification says (200 and an empty response in the request's encoding; 400 for a request
  that does not parse, which the sender does not retry);
- ``GET /metrics``: the Prometheus text format (:mod:`~llm_latency.advise.exposition`);
- ``GET /`` and ``GET /findings.json``: the findings (:mod:`~llm_latency.advise.page`);
- ``GET /healthz``: 200 once the server runs.

A thread runs the diagnosis every interval. Nothing is written to disk: the service holds a copy
of spans the Collector also sends on, so a restart loses only its windows, which refill.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)

from llm_latency.advise.advisor import Advisor
from llm_latency.advise.exposition import CONTENT_TYPE, exposition
from llm_latency.advise.otlp_input import MAX_BODY, BadRequest, decompress, spans_of_request
from llm_latency.advise.page import as_json, page

logger = logging.getLogger("llm_latency.advise")


class AdviseServer(ThreadingHTTPServer):
    """The HTTP server, with the :class:`Advisor` its handlers feed and read."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self, address: tuple[str, int], advisor: Advisor, external_url: str | None = None
    ) -> None:
        super().__init__(address, _Handler)
        self.advisor = advisor
        #: Where the page's readers reach this server (the alert links there).
        self.external_url = external_url or self.url
        self._stop = threading.Event()
        self._diagnosis = threading.Thread(
            target=self._diagnose_every_interval, name="llm-latency-advise", daemon=True
        )

    @property
    def url(self) -> str:
        """The address the server answers at."""
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start_diagnosis(self) -> None:
        """Starts the thread that diagnoses the windows every interval."""
        self._diagnosis.start()

    def _diagnose_every_interval(self) -> None:
        while not self._stop.wait(self.advisor.settings.interval):
            try:
                self.advisor.run_diagnosis()
            except Exception:  # the next interval tries again; the server keeps receiving
                logger.exception("the diagnosis failed")

    def server_close(self) -> None:
        self._stop.set()
        super().server_close()


class _Handler(BaseHTTPRequestHandler):
    server: AdviseServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug(format, *args)

    def do_POST(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        if path != "/v1/traces":
            self._send(404, "text/plain", b"not found\n")
            return
        content_type = self.headers.get("Content-Type")
        is_json = (content_type or "").split(";")[0].strip().lower() == "application/json"
        try:
            length = int(self.headers.get("Content-Length") or -1)
            if not 0 <= length <= MAX_BODY:
                raise BadRequest("a body with a Content-Length up to 64 MiB is needed")
            body = decompress(self.rfile.read(length), self.headers.get("Content-Encoding"))
            spans = spans_of_request(body, content_type)
        except BadRequest as exc:
            self._send(400, "text/plain", f"{exc}\n".encode(), close=True)
            return
        self.server.advisor.receive(spans)
        if is_json:
            self._send(200, "application/json", b"{}")
        else:
            answer = ExportTraceServiceResponse().SerializeToString()
            self._send(200, "application/x-protobuf", answer)

    def do_GET(self) -> None:
        parts = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(parts.query)
        service = query.get("service", [None])[0]
        host = query.get("host", [None])[0]
        snapshot = self.server.advisor.snapshot
        if parts.path == "/metrics":
            self._send(200, CONTENT_TYPE, exposition(snapshot, self.server.external_url).encode())
        elif parts.path == "/findings.json":
            text = json.dumps(as_json(snapshot, service, host), indent=1)
            self._send(200, "application/json", text.encode())
        elif parts.path == "/":
            self._send(200, "text/html; charset=utf-8", page(snapshot, service, host).encode())
        elif parts.path == "/healthz":
            self._send(200, "text/plain", b"ok\n")
        else:
            self._send(404, "text/plain", b"not found\n")

    def _send(self, status: int, content_type: str, body: bytes, close: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)
