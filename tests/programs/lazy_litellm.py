"""litellm imported after ``instrument()``, as a program does it: its import brings the openai
SDK in, whose hooks go in first; the litellm call is still the one parent of every attempt,
across the SDK's retries and litellm's own. Prints ``OK`` lines a test checks.

    python tests/programs/lazy_litellm.py BASE_URL   (the server answers 429 twice first)
"""

from __future__ import annotations

import os
import sys

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import llm_latency


def main(base_url: str) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    llm_latency.instrument(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(), configure=False
    )
    imported = [name for name in ("litellm", "openai") if name in sys.modules]
    print(f"OK imported by instrument(): {imported}")

    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    import litellm  # imported only now: the openai and litellm hooks go in at this import

    litellm.suppress_debug_info = True
    answer = litellm.completion(
        model="openai/m", messages=[{"role": "user", "content": "hi"}], api_base=base_url,
        api_key="sk-test", num_retries=1,
    )  # fmt: skip
    assert answer.choices[0].message.content
    spans = exporter.get_finished_spans()
    parents = [s for s in spans if s.name.startswith(("litellm ", "openai "))]
    print(f"OK parents: {[p.name for p in parents]}")
    (parent,) = parents
    under = sorted(
        (s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id),
        key=lambda s: s.start_time or 0,
    )
    print(
        "OK under it:",
        [
            s.name if s.name == "retry.backoff"
            else (s.attributes or {}).get("http.response.status_code")
            for s in under
        ],
    )  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
