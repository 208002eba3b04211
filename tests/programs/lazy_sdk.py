"""``instrument()`` imports no client library and no SDK; the openai SDK imported afterwards is
hooked all the same (its call is the logical parent of its attempts), and one imported after
``uninstrument()`` is left alone. Prints ``OK`` lines a test checks.

    python tests/programs/lazy_sdk.py BASE_URL
"""

from __future__ import annotations

import sys

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import llm_latency

LIBRARIES = ("openai", "anthropic", "aiohttp", "httpx", "httpx2", "requests", "urllib3")


def main(base_url: str) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    llm_latency.instrument(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(), configure=False
    )
    imported = [name for name in LIBRARIES if name in sys.modules]
    print(f"OK imported by instrument(): {imported}")

    import openai  # imported only now: the hooks go in at this import

    client = openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    spans = exporter.get_finished_spans()
    parents = [s for s in spans if s.name.startswith("openai ")]
    attempts = [s for s in spans if s.kind.name == "CLIENT"]
    assert len(parents) == 1 and len(attempts) == 1, [s.name for s in spans]
    assert attempts[0].parent is not None
    assert attempts[0].parent.span_id == parents[0].context.span_id
    print(f"OK {parents[0].name} > {attempts[0].name}")

    llm_latency.uninstrument()
    # Imported after uninstrument(): a stale hook must not install anything.
    from anthropic._base_client import SyncAPIClient

    print(
        f"OK anthropic hooked after uninstrument(): {hasattr(SyncAPIClient.request, '__wrapped__')}"
    )


if __name__ == "__main__":
    main(sys.argv[1])
