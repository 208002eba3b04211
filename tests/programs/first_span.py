"""A program whose own span is around its first LLM call: its tracer taken at import, then
``llm_latency.instrument()`` with no providers, a span of its own that ends before the first
call (``start-up``), and one around it (``first call``).

With ``--own-setup``, the program sets its own tracer provider up after its ``start-up`` span
(printing ``MINE <span name>`` for each span it receives); without, llm-latency sets the SDK up
from ``OTEL_*`` at the first call.

    python tests/programs/first_span.py [--own-setup] URL
"""

from __future__ import annotations

import argparse

from opentelemetry import trace

# As programs do: the tracer at import, before any set-up (the API's proxy tracer).
tracer = trace.get_tracer("first-span-program")


def own_setup() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    provider = TracerProvider()
    exporter = ConsoleSpanExporter(formatter=lambda span: f"MINE {span.name}\n")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--own-setup", action="store_true")
    parser.add_argument("url")
    options = parser.parse_args()

    import requests

    import llm_latency

    llm_latency.instrument()
    with tracer.start_as_current_span("start-up"):
        pass
    if options.own_setup:
        own_setup()
    with tracer.start_as_current_span("first call"):
        requests.post(options.url, json={"model": "m"}, timeout=10).raise_for_status()
    with tracer.start_as_current_span("second call"):
        requests.post(options.url, json={"model": "m"}, timeout=10).raise_for_status()


if __name__ == "__main__":
    main()
