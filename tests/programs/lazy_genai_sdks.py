"""``instrument()`` imports none of google-genai, mistralai, cohere and groq; each is hooked when
the program imports it. Prints ``OK`` lines a test checks.

    python tests/programs/lazy_genai_sdks.py GROQ_BASE_URL
"""

from __future__ import annotations

import sys

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import llm_latency

SDKS = ("google.genai", "mistralai", "cohere", "groq")


def main(base_url: str) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    llm_latency.instrument(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(), configure=False
    )
    print(f"OK imported by instrument(): {[name for name in SDKS if name in sys.modules]}")

    import groq  # imported only now: the hooks go in at this import

    client = groq.Groq(base_url=base_url, api_key="gsk-test", max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    spans = exporter.get_finished_spans()
    parents = [s for s in spans if s.name.startswith("groq ")]
    attempts = [s for s in spans if s.kind.name == "CLIENT"]
    assert len(parents) == 1 and len(attempts) == 1, [s.name for s in spans]
    assert attempts[0].parent is not None
    assert attempts[0].parent.span_id == parents[0].context.span_id
    print(f"OK {parents[0].name} > {attempts[0].name}")

    import cohere.core.http_client
    import google.genai._api_client
    import mistralai  # noqa: F401  (mistralai 2's hook goes in at this import)

    try:
        from mistralai.client import basesdk
    except ImportError:  # mistralai 1.x
        from mistralai import basesdk  # type: ignore[attr-defined,no-redef]
    methods = {
        "google-genai": google.genai._api_client.BaseApiClient._request,
        "mistralai": basesdk.BaseSDK.do_request,
        "cohere": cohere.core.http_client.HttpClient.request,
    }
    hooked = [name for name, method in methods.items() if hasattr(method, "__wrapped__")]
    print(f"OK hooked: {' '.join(hooked)}")


if __name__ == "__main__":
    main(sys.argv[1])
