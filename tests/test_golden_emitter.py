"""The emitter's whole output, held byte for byte: fixed Timelines in, every exported span and
metric point out, compared with ``tests/data/golden_emitter.json``.

Nothing here is measured: the attempts are Timelines whose every reading is set by the test
(a frozen clock it moves itself), the ids come from a counter, and each scenario drives the
emitter through the calls the adapters make (``start``, the Timeline's phases and chunks,
``finish`` or ``finish_failed``; a logical call's ``open_call``/``close_call``). So a change
that only reorganises the code must leave the file as it is: any difference is a change in
what users see in their traces and dashboards, which is then deliberate and reviewed.

After a deliberate change: ``LLM_LATENCY_UPDATE_GOLDEN=1 pytest tests/test_golden_emitter.py``
rewrites the file, and the diff of the file is the review.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import opentelemetry.sdk.metrics._internal.instrument as sdk_instrument
import opentelemetry.sdk.trace as sdk_trace
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    MetricsData,
    NumberDataPoint,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator

import llm_latency
from llm_latency import emitter as emitting
from llm_latency import timeline as timeline_module
from llm_latency.calls import current_call
from llm_latency.emitter import Emitter
from llm_latency.timeline import PHASE_NAMES, Timeline

GOLDEN = Path(__file__).parent / "data" / "golden_emitter.json"
UPDATE = os.environ.get("LLM_LATENCY_UPDATE_GOLDEN") == "1"

#: The epoch (ns) of the frozen clock's zero: 2026-01-01T00:00:00Z.
EPOCH_NS = 1_767_225_600 * 10**9
PHASE = {name: index for index, name in enumerate(PHASE_NAMES)}
MS = 1_000_000


class FrozenClock:
    """Every clock llm-latency and the SDK read, standing still until the test moves it."""

    def __init__(self) -> None:
        self.mono_ns = 10**12

    def at(self, ms: float) -> int:
        """Move to ``ms`` after the clock's zero; the monotonic reading there."""
        self.mono_ns = 10**12 + int(ms * MS)
        return self.mono_ns

    def monotonic_ns(self) -> int:
        return self.mono_ns

    def epoch_ns(self) -> int:
        return EPOCH_NS + self.mono_ns - 10**12


class SequentialIds(IdGenerator):
    """Span and trace ids 1, 2, 3, ... (the SDK's random ones would differ each run)."""

    def __init__(self) -> None:
        self._span = 0
        self._trace = 0

    def generate_span_id(self) -> int:
        self._span += 1
        return self._span

    def generate_trace_id(self) -> int:
        self._trace += 1
        return self._trace


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FrozenClock:
    frozen = FrozenClock()
    monkeypatch.setattr(timeline_module, "clock_ns", frozen.monotonic_ns)
    monkeypatch.setattr(time, "time_ns", frozen.epoch_ns)
    monkeypatch.setattr(sdk_trace, "time_ns", frozen.epoch_ns)
    # The time of the exemplars the SDK's own path records (the direct path reads time.time_ns)
    monkeypatch.setattr(sdk_instrument, "time_ns", frozen.epoch_ns)
    return frozen


class Run:
    """One instrumentation with its own providers, fed scenarios through its emitter."""

    def __init__(self, clock: FrozenClock, **options: Any) -> None:
        self.clock = clock
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider(id_generator=SequentialIds())
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        llm_latency.instrument(
            tracer_provider=self.tracer_provider,
            meter_provider=self.meter_provider,
            configure=False,
            clients=[],
            **options,
        )
        assert emitting.active is not None
        self.emitter: Emitter = emitting.active

    def attempt(
        self,
        method: str,
        url: str,
        start_ms: float,
        phases: Sequence[tuple[str, float, float]],
        *,
        status: int | None = 200,
        headers: Sequence[tuple[str, str]] = (),
        content_type: str | None = None,
        chunks: Sequence[tuple[float, bytes]] = (),
        end_ms: float | None = None,
        error: BaseException | None = None,
        reused: bool | None = None,
        closed_by: str | None = None,
        proxy: str | None = None,
        resend_count: int = 0,
        client: str = "golden",
    ) -> Timeline:
        """One attempt from ``start_ms`` on: its phases (name, start, end in ms; an end of
        ``-1`` leaves the phase open for ``error`` to fail), the response, its body chunks."""
        self.clock.at(start_ms)
        timeline = Timeline(method, url)
        timeline.client = client
        timeline.resend_count = resend_count
        _, rest = url.split("://", 1)
        authority, _, path = rest.partition("/")
        authority = authority.rpartition("@")[2]  # as the adapters give it: no credentials
        host, _, port = authority.rpartition(":") if ":" in authority else (authority, "", "")
        carrier: dict[str, str] = {}
        self.emitter.start(timeline, host, int(port) if port else None, "/" + path, carrier)
        timeline.protocol_version = "1.1"
        timeline.reused = reused
        timeline.closed_by = closed_by
        timeline.peer_address = "192.0.2.7"
        timeline.proxy_url = proxy
        for name, start, end in phases:
            timeline.begin(PHASE[name], at=self.clock.at(start))
            if end >= 0:
                timeline.end_phase(PHASE[name], at=self.clock.at(end))
        if error is not None:
            self.clock.at(end_ms if end_ms is not None else phases[-1][1])
            self.emitter.finish_failed(timeline, error)
            return timeline
        timeline.status_code = status
        timeline.response_headers = [(k.encode(), v.encode()) for k, v in headers]
        if content_type is not None:
            timeline.response_body(content_type)
        for at, data in chunks:
            self.clock.at(at)
            timeline.chunk(data)
        self.clock.at(end_ms if end_ms is not None else phases[-1][2])
        self.emitter.finish(timeline)
        assert carrier.get("traceparent", "").startswith("00-")
        return timeline

    def output(self) -> dict[str, Any]:
        metrics = self.reader.get_metrics_data()
        llm_latency.uninstrument()
        return {
            "spans": [span_json(span) for span in self.exporter.get_finished_spans()],
            "metrics": metrics_json(metrics),
        }


def span_json(span: ReadableSpan) -> dict[str, Any]:
    assert span.context is not None
    scope = span.instrumentation_scope
    return {
        "name": span.name,
        "trace_id": f"{span.context.trace_id:x}",
        "span_id": f"{span.context.span_id:x}",
        "parent": None if span.parent is None else f"{span.parent.span_id:x}",
        "kind": span.kind.name,
        "scope": None if scope is None else [scope.name, scope.schema_url],
        "start": span.start_time,
        "end": span.end_time,
        "status": [span.status.status_code.name, span.status.description],
        "attributes": plain(dict(span.attributes or {})),
        "events": [
            {"name": e.name, "time": e.timestamp, "attributes": plain(dict(e.attributes or {}))}
            for e in span.events
        ],
        "links": [
            {
                "span_id": f"{link.context.span_id:x}",
                "attributes": plain(dict(link.attributes or {})),
            }
            for link in span.links
        ],
    }


def plain(attributes: dict[str, Any]) -> dict[str, Any]:
    """Attributes in a stable order, sequences as lists; a stack trace without its frames'
    file paths and line numbers (the test's own, not the emitter's)."""
    out: dict[str, Any] = {}
    for name in sorted(attributes):
        value = attributes[name]
        if name == "exception.stacktrace":
            value = value.splitlines()[-1]
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


def metrics_json(data: MetricsData | None) -> list[dict[str, Any]]:
    """Every metric point, by instrument; the collection's own timestamps left out."""
    assert data is not None
    found = []
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                points = [point_json(point) for point in metric.data.data_points]
                points.sort(key=lambda point: json.dumps(point["attributes"], sort_keys=True))
                found.append(
                    {
                        "scope": scope_metrics.scope.name,
                        "name": metric.name,
                        "unit": metric.unit,
                        "description": metric.description,
                        "type": type(metric.data).__name__,
                        "temporality": getattr(
                            getattr(metric.data, "aggregation_temporality", None), "name", None
                        ),
                        "monotonic": getattr(metric.data, "is_monotonic", None),
                        "points": points,
                    }
                )
    found.sort(key=lambda metric: (metric["scope"], metric["name"]))
    return found


def point_json(point: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"attributes": plain(dict(point.attributes or {}))}
    if isinstance(point, NumberDataPoint):
        out["value"] = point.value
    else:
        assert isinstance(point, HistogramDataPoint), point
        out.update(
            count=point.count,
            sum=point.sum,
            min=point.min,
            max=point.max,
            bounds=list(point.explicit_bounds),
            buckets=list(point.bucket_counts),
        )
    out["exemplars"] = [
        {
            "value": exemplar.value,
            "trace_id": None if exemplar.trace_id is None else f"{exemplar.trace_id:x}",
            "span_id": None if exemplar.span_id is None else f"{exemplar.span_id:x}",
            "time": exemplar.time_unix_nano,
            "attributes": plain(dict(exemplar.filtered_attributes or {})),
        }
        for exemplar in point.exemplars or ()
    ]
    return out


# -- the scenarios ------------------------------------------------------------------------------

OPENAI = "https://api.openai.com/v1/chat/completions"
ANTHROPIC = "https://api.anthropic.com/v1/messages"
OPENAI_HEADERS = (
    ("content-type", "text/event-stream"),
    ("x-request-id", "req_golden_1"),
    ("openai-processing-ms", "180"),
    ("x-ratelimit-remaining-requests", "41"),
    ("x-ratelimit-remaining-tokens", "90000"),
    ("x-ratelimit-limit-requests", "500"),
    ("x-golden-extra", "captured when asked for"),
)


def sse(*events: dict[str, Any]) -> list[bytes]:
    return [b"data: " + json.dumps(event).encode() + b"\n\n" for event in events] + [
        b"data: [DONE]\n\n"
    ]


def openai_stream() -> list[tuple[float, bytes]]:
    """A streamed chat completion: a role chunk, three tokens 10 ms apart, the usage chunk."""

    def delta(content: str | None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-1",
            "model": "gpt-golden",
            "choices": [{"index": 0, "delta": {"content": content} if content else {"role": "assistant"}}],
        }  # fmt: skip

    usage = {
        "id": "chatcmpl-1",
        "model": "gpt-golden",
        "choices": [],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    }
    events = sse(delta(None), delta("Hel"), delta("lo"), delta("!"), usage)
    times = [260.0, 262.0, 272.0, 282.0, 290.0, 291.0]
    return list(zip(times, events, strict=True))


def anthropic_answer() -> bytes:
    return json.dumps(
        {
            "id": "msg_1",
            "type": "message",
            "model": "claude-golden",
            "content": [{"type": "text", "text": "Hi"}],
            "usage": {"input_tokens": 20, "output_tokens": 2, "cache_read_input_tokens": 5},
        }
    ).encode()


def scenarios(run: Run) -> None:
    """Every kind of attempt the emitter tells apart, each at its own fixed times."""
    # A new TLS connection, a streamed answer with its usage, rate-limit headers.
    run.attempt(
        "POST", OPENAI, 0,
        [("dns", 0, 15), ("connect", 15, 40), ("tls", 40, 80), ("send", 80, 81),
         ("wait", 81, 260), ("receive", 260, 291)],
        headers=OPENAI_HEADERS, content_type="text/event-stream", chunks=openai_stream(),
        reused=False,
    )  # fmt: skip
    # A pooled connection after a wait in the pool's queue, a JSON answer with usage.
    run.attempt(
        "POST", ANTHROPIC, 1000,
        [("queue", 1000, 1120), ("send", 1120, 1121), ("wait", 1121, 1500),
         ("receive", 1500, 1502)],
        headers=(("content-type", "application/json"), ("request-id", "req_ant_1"),
                 ("anthropic-ratelimit-requests-remaining", "7")),
        content_type="application/json", chunks=[(1501.0, anthropic_answer())], reused=True,
    )  # fmt: skip
    # A logical call: a 429 with retry-after, the wait, then a success on the same connection.
    run.clock.at(1990)
    call = run.emitter.calls.open_call(
        "chat gpt-golden", {"gen_ai.operation.name": "chat"}, numbers_attempts=True
    )
    token, attached = current_call.set(call), run.emitter.calls.enter_call(call)
    try:
        run.attempt(
            "POST", OPENAI, 2000, [("send", 2000, 2001), ("wait", 2001, 2050), ("receive", 2050, 2051)],
            status=429, headers=(("retry-after", "0.2"), ("x-request-id", "req_429"),
                                 ("x-ratelimit-remaining-requests", "0")),
            content_type="application/json", chunks=[(2051.0, b'{"error": {}}')], reused=True,
        )  # fmt: skip
        run.attempt(
            "POST", OPENAI, 2300, [("send", 2300, 2301), ("wait", 2301, 2600), ("receive", 2600, 2602)],
            headers=(("content-type", "application/json"), ("x-request-id", "req_ok")),
            content_type="application/json",
            chunks=[(2601.0, json.dumps({"id": "c", "model": "gpt-golden", "choices": [],
                     "usage": {"prompt_tokens": 4, "completion_tokens": 9}}).encode())],
            reused=True, resend_count=1,
        )  # fmt: skip
    finally:
        run.emitter.calls.exit_call(attached)
        current_call.reset(token)
        run.clock.at(2610)
        run.emitter.calls.close_call(call)
    # A refused connection: the connect phase fails.
    run.attempt(
        "GET", "http://user:secret@10.0.0.9:8080/v1/models?api-key=k", 3000,
        [("connect", 3000, -1)], error=ConnectionRefusedError(111, "Connection refused"),
        end_ms=3004, proxy="http://proxyuser:pw@proxy.test:3128",
    )  # fmt: skip
    # An unknown method, a server error, no body, on a connection closed after it.
    run.attempt(
        "PURGE", "http://cache.test/v1/models", 4000,
        [("connect", 4000, 4001), ("send", 4001, 4002), ("wait", 4002, 4010)],
        status=503, reused=False, closed_by="force_close=True",
    )  # fmt: skip


CONFIGURATIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "options": {
        "phase_spans": False,
        "phase_metrics": "all",
        "time_per_output_chunk": True,
        "capture_response_headers": ["x-golden-extra"],
        "propagate": True,
    },
    "slow_path": {"phase_span_fast_path": False},
}


def test_the_emitter_output_is_the_golden_one(clock: FrozenClock) -> None:
    output = {}
    for name, options in CONFIGURATIONS.items():
        run = Run(clock, **options)
        try:
            scenarios(run)
        finally:
            output[name] = run.output()
    text = json.dumps(output, indent=1, sort_keys=False) + "\n"
    if UPDATE:
        GOLDEN.write_text(text)
    expected = GOLDEN.read_text()
    assert text == expected, "the emitter's output changed: see the module's docstring"
