"""One SDK call that gets a 429 and then succeeds, with llm-latency and OpenLLMetry's (traceloop's)
instrumentation of that SDK both on; prints the finished spans as JSON lines.

It runs in a process of its own: OpenLLMetry's ``uninstrument()`` leaves the SDK's methods
wrapped (seen with ``opentelemetry-instrumentation-openai`` 0.62.4), which would change every
later test in the same process. Its packages are installed apart, in the virtual
environment's ``openllmetry`` folder (Makefile): installed in the environment itself, their
entry points (named ``openai`` and ``anthropic``, like openai-v2's) would make
``opentelemetry-instrument`` load them in every other test that runs it.

    python tests/programs/openllmetry_call.py openai|anthropic
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository: tests.provider_api
sys.path.insert(0, str(Path(sys.prefix) / "openllmetry"))

import anthropic
import openai
from opentelemetry.instrumentation.anthropic import AnthropicInstrumentor
from opentelemetry.instrumentation.openai import OpenAIInstrumentor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import llm_latency
from tests.provider_api import provider_server


async def call(sdk: str) -> None:
    headers = {"x-test-scenario": f"openllmetry-{sdk}", "x-test-fail": "1"}
    async with provider_server() as provider:
        if sdk == "openai":
            await openai.AsyncOpenAI(
                base_url=provider.openai_base, api_key="sk-test"
            ).chat.completions.create(
                model="gpt-test",
                messages=[{"role": "user", "content": "hi"}],
                extra_headers=headers,
            )
        else:
            await anthropic.AsyncAnthropic(
                base_url=provider.anthropic_base, api_key="sk-test"
            ).messages.create(
                model="claude-test",
                max_tokens=16,
                messages=[{"role": "user", "content": "hi"}],
                extra_headers=headers,
            )


def main() -> None:
    sdk = sys.argv[1]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    llm_latency.instrument(
        tracer_provider=provider, meter_provider=MeterProvider(), configure=False
    )
    instrumentor = OpenAIInstrumentor() if sdk == "openai" else AnthropicInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    asyncio.run(call(sdk))
    for span in exporter.get_finished_spans():
        assert span.context is not None
        print(
            json.dumps(
                {
                    "name": span.name,
                    "kind": span.kind.name,
                    "span_id": span.context.span_id,
                    "parent_id": span.parent.span_id if span.parent else None,
                    "start": span.start_time,
                    "scope": span.instrumentation_scope.name if span.instrumentation_scope else "",
                    "genai": any(key.startswith("gen_ai.") for key in span.attributes or {}),
                }
            )
        )


if __name__ == "__main__":
    main()
