"""Gunicorn-style workers: instrument() in the parent, then two forked workers that each send
three requests and flush their spans to an OTLP/HTTP endpoint. Exits 0 when both workers did.

    python tests/programs/prefork.py OTLP_TRACES_ENDPOINT URL
"""

from __future__ import annotations

import os
import sys

import requests
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import llm_latency


def main(endpoint: str, url: str) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "prefork"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    llm_latency.instrument(
        tracer_provider=provider, meter_provider=MeterProvider(), configure=False
    )
    children = []
    for worker in range(2):  # fork the workers after start-up
        pid = os.fork()
        if pid == 0:
            for _ in range(3):
                requests.get(url + f"&worker={worker}")
            provider.force_flush()
            os._exit(0)
        children.append(pid)
    for pid in children:
        assert os.waitpid(pid, 0)[1] == 0


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
