"""README's quick start takes the path the benches measure: with no providers passed to
``instrument()``, whether llm-latency sets the SDK up at the first request or the program sets
its own providers after ``instrument()``, the histograms are made on the real meter once a meter
provider is set, so their records take the direct path (``histograms``), and are exported.

Before, they were made on the API's proxy meter, whose histograms forward each record through
the API for the life of the process (1.35 x the official instrumentation's added instructions
per request, against 1.06 x with the providers passed; docs/overhead.md)."""

from __future__ import annotations

import asyncio

import pytest

from tests.otlp_receiver import OTLPReceiver
from tests.servers import LLMServer
from tests.test_providers import Run, run_app

CALLS = 3


@pytest.mark.parametrize("setup", ["none", "after"])
async def test_the_quick_start_records_through_the_direct_path(
    server: LLMServer, setup: str
) -> None:
    receiver = OTLPReceiver()
    try:
        run: Run = await asyncio.to_thread(
            run_app, server.url(), "--setup", setup, "--client", "openai", "--calls", str(CALLS),
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE="delta",
        )  # fmt: skip
    finally:
        receiver.stop()
    assert run.lines("DIRECT") == ["DIRECT True True"], run.stderr
    if setup == "none":  # set up by llm-latency from OTEL_*: exported over OTLP at exit
        assert receiver.duration_count == CALLS, (receiver.metric_exports(), run.stderr)
    else:  # the program's own reader
        assert "METRIC http.client.request.duration" in run.lines("METRIC")
        assert receiver.duration_count == 0  # nothing set up beside the program's providers
