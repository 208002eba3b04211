"""A program that calls an LLM endpoint, instrumented by llm-latency, with or without an
OpenTelemetry set-up of its own (``--setup before|after|none``).

Its own set-up prints every span it receives as ``MINE <name> <service.name>``; at the end it
prints ``METRIC <name>`` for each llm-latency metric its reader holds, ``DIRECT <bool> <bool>``
(whether the request duration's and the phases' records take the histograms' direct path), and
``DONE <monotonic>`` when its calls are over (so a test can see how long the exit took).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def own_setup() -> Any:
    """The program's own providers: a resource, a printing span processor, a metric reader."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    def line(span: ReadableSpan) -> str:
        service = span.resource.attributes["service.name"]
        assert isinstance(service, str), service  # Resource.create's own, a string
        return f"MINE {span.name} {service}\n"

    resource = Resource.create({"service.name": "program-own"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(formatter=line)))
    trace.set_tracer_provider(tracer_provider)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[reader]))
    return reader


def call(client: str, url: str) -> None:
    if client == "requests":
        import requests

        requests.post(url, json={"model": "m"}, timeout=10).raise_for_status()
    elif client == "openai":
        import openai

        base = url.split("/chat/completions")[0]
        openai.OpenAI(base_url=base, api_key="sk-test", max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    else:
        raise SystemExit(f"unknown client {client}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--setup", choices=["before", "after", "none"], default="none")
    parser.add_argument("--client", choices=["requests", "openai"], default="requests")
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--no-sdk", action="store_true", help="act as if the SDK were missing")
    options = parser.parse_args()
    if options.no_sdk:
        sys.modules["opentelemetry.sdk"] = None  # type: ignore[assignment]
    reader = own_setup() if options.setup == "before" else None

    import llm_latency

    llm_latency.instrument()
    if options.setup == "after":
        reader = own_setup()
    for _ in range(options.calls):
        call(options.client, options.url)
    if reader is not None:
        data = reader.get_metrics_data()
        for resource_metrics in data.resource_metrics if data else ():
            for scope in resource_metrics.scope_metrics:
                if scope.scope.name == "llm_latency":
                    for metric in scope.metrics:
                        print(f"METRIC {metric.name}")
    from llm_latency import emitter

    if emitter.active is not None:
        recorded = emitter.active.metrics
        print(f"DIRECT {recorded.request_duration.direct} {recorded.phase_duration.direct}")
    print(f"DONE {time.monotonic()}", flush=True)


if __name__ == "__main__":
    main()
