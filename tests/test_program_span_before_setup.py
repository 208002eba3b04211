"""A program's own span started before llm-latency sets the SDK up (at the first instrumented
request) is exported, with the attempt under it: the most natural first program, a span around
its first call, lost nothing. A program that sets its own providers up later still gets every
span llm-latency makes, and llm-latency exports nothing of its own."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from tests.otlp_receiver import OTLPReceiver, Span
from tests.servers import LLMServer, unused_port

PROGRAM = Path(__file__).parent / "programs" / "first_span.py"


def run(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environment["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{unused_port()}"
    environment["OTEL_METRICS_EXPORTER"] = "none"
    environment.update(env)
    result = subprocess.run(
        [sys.executable, str(PROGRAM), *args, url],
        capture_output=True, text=True, env=environment, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result


def named(spans: list[Span], name: str) -> Span:
    (found,) = [span for span in spans if span.name == name]
    return found


async def test_the_programs_span_before_the_set_up_is_exported_with_the_attempt_under_it(
    server: LLMServer,
) -> None:
    receiver = OTLPReceiver()
    try:
        result = await asyncio.to_thread(
            run, server.url(), OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint
        )
    finally:
        receiver.stop()
    spans = receiver.spans
    # Ended before the first request, and started before it, ended after.
    started = named(spans, "start-up")
    assert started.parent_id is None
    first, second = named(spans, "first call"), named(spans, "second call")
    attempts = [span for span in spans if "url.full" in span.attributes]
    assert [attempt.parent_id for attempt in attempts] == [first.span_id, second.span_id]
    for attempt in attempts:
        phases = {span.name for span in spans if span.parent_id == attempt.span_id}
        assert {"http.send", "http.wait", "http.receive"} <= phases
    assert result.stderr == ""


async def test_a_program_setting_up_after_its_first_span_keeps_its_providers(
    server: LLMServer,
) -> None:
    receiver = OTLPReceiver()
    try:
        result = await asyncio.to_thread(
            run, server.url(), "--own-setup", OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint
        )
    finally:
        receiver.stop()
    mine = [line for line in result.stdout.splitlines() if line.startswith("MINE ")]
    assert "MINE POST /v1/chat/completions" in mine
    assert "MINE http.wait" in mine
    assert {"MINE first call", "MINE second call"} <= set(mine)
    # Started before the program's own set-up: not the program's, and not exported by an SDK
    # llm-latency set up (there is none).
    assert "MINE start-up" not in mine
    assert receiver.spans == []
    assert result.stderr == ""  # no "Overriding of current TracerProvider is not allowed"


#: Ends its instrumentation before any request: what was held is dropped, and the API's proxy
#: tracer is the API's own again.
ENDED_FIRST = """
import inspect
from opentelemetry import trace
import llm_latency

api = inspect.getattr_static(trace.ProxyTracer, "_tracer")
tracer = trace.get_tracer("program")
llm_latency.instrument()
with tracer.start_as_current_span("held") as span:
    print("RECORDING", span.is_recording())
print("HELD", llm_latency.live_state()["held_spans"])
llm_latency.uninstrument()
print("HELD", llm_latency.live_state()["held_spans"])
print("API", inspect.getattr_static(trace.ProxyTracer, "_tracer") is api)
with tracer.start_as_current_span("after") as span:
    print("RECORDING", span.is_recording())
"""


def test_an_instrumentation_ended_before_its_first_request_drops_what_it_held() -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    result = subprocess.run(
        [sys.executable, "-c", ENDED_FIRST],
        capture_output=True, text=True, env=environment, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "RECORDING True",
        "HELD 1",
        "HELD 0",
        "API True",
        "RECORDING False",
    ]
