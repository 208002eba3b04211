"""One aiohttp GET of URL, after a set-up chosen by ``--setup``:

- ``none``: nothing (for ``opentelemetry-instrument`` to set up);
- ``instrument``: ``llm_latency.instrument()``, which configures the SDK from ``OTEL_*``;
- ``own``: the program's own tracer provider, printing ``MINE <span name>`` per span, set
  before ``llm_latency.instrument()``.

    python tests/programs/aiohttp_get.py [--setup none|instrument|own] URL
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp


def own_provider() -> None:
    """A global tracer provider of the program's own, printing each span as one line."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    provider = TracerProvider()
    exporter = ConsoleSpanExporter(formatter=lambda span: "MINE " + span.name + "\n")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


async def get(url: str) -> None:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        await response.read()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--setup", choices=["none", "instrument", "own"], default="none")
    parser.add_argument("url")
    args = parser.parse_args()
    if args.setup == "own":
        own_provider()
    if args.setup in ("instrument", "own"):
        import llm_latency

        llm_latency.instrument()
    asyncio.run(get(args.url))


if __name__ == "__main__":
    main()
