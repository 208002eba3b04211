"""Jaeger, fed by the real Collector with the compose configuration: every call's trace as the
program exported it, and the Monitor tab's numbers from the Collector's span metrics."""

from __future__ import annotations

import bisect
import json
import math
import time
from collections import Counter, defaultdict
from typing import Any

import pytest
import yaml

from llm_latency.cli.demo import SCENE_SPANS
from tests.command_line import run_cli_process
from tests.e2e.bundle import COMPOSE, get_json, wait_for
from tests.e2e.conftest import Run, report

#: The calls tests/e2e/workload.py makes in ``calls`` mode, one trace each: three openai calls,
#: a stream, a call retried after a 429, two fresh aiohttp requests, a burst of six, a refused
#: connection.
CALLS = 3 + 1 + 1 + 2 + 6 + 1

PROTOCOLS = ["http", "grpc"]


def jaeger_traces(run: Run, service: str) -> dict[str, list[dict[str, Any]]]:
    """Jaeger's traces of ``service`` by trace id (the query API the UI uses)."""
    answer = get_json(
        run.bundle.url("jaeger", 16686, "/api/traces"),
        {"service": service, "limit": 1000, "lookback": "1h"},
    )
    return {trace["traceID"]: trace["spans"] for trace in answer["data"]}


def _tag_value(tag: dict[str, Any]) -> Any:
    value = tag["value"]
    # Jaeger has no array type: an OTLP array attribute arrives as its JSON text.
    if tag["type"] == "string" and value.startswith("["):
        return json.loads(value)
    return value


def as_jaeger_shows(span: dict[str, Any]) -> dict[str, Any]:
    """A Jaeger span in the recorded spans' shape."""
    parents = [ref["spanID"] for ref in span.get("references", []) if ref["refType"] == "CHILD_OF"]
    tags = {tag["key"]: _tag_value(tag) for tag in span["tags"]}
    status = tags.pop("otel.status_code", "UNSET")
    tags.pop("otel.status_description", None)
    kind = tags.pop("span.kind", "internal").upper()
    tags.pop("error", None)
    for key in ("otel.scope.name", "otel.scope.version", "internal.span.format"):
        tags.pop(key, None)
    return {
        "span_id": span["spanID"],
        "parent_id": parents[0] if parents else None,
        "name": span["operationName"],
        "kind": kind,
        "status": status,
        "attributes": tags,
    }


def as_recorded(span: dict[str, Any]) -> dict[str, Any]:
    return {
        key: span[key] for key in ("span_id", "parent_id", "name", "kind", "status", "attributes")
    }


@pytest.fixture(scope="module")
def finished(run: Run) -> Run:
    for workload in run.calls.values():
        workload.wait(timeout=120)
    return run


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_jaeger_has_every_calls_trace_as_the_program_exported_it(
    finished: Run, protocol: str
) -> None:
    workload = finished.calls[protocol]
    recorded: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for span in workload.spans():
        recorded[span["trace_id"]].append(span)
    assert len(recorded) == CALLS

    def complete() -> dict[str, list[dict[str, Any]]] | None:
        traces = jaeger_traces(finished, workload.service)
        spans = sum(len(trace) for trace in traces.values())
        return traces if spans == sum(len(trace) for trace in recorded.values()) else None

    traces = wait_for(complete, timeout=60, what=f"every span of {workload.service} in Jaeger")
    assert set(traces) == set(recorded)
    count = sum(len(trace) for trace in traces.values())
    report(
        f"Jaeger, OTLP/{protocol}: {len(traces)} traces of {CALLS} calls, {count} spans, as exported"
    )
    for trace_id, spans in recorded.items():
        shown = sorted(
            (as_jaeger_shows(span) for span in traces[trace_id]), key=lambda s: s["span_id"]
        )
        assert shown == sorted((as_recorded(span) for span in spans), key=lambda s: s["span_id"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_traces_have_the_calls_phases_retries_and_failures(
    finished: Run, protocol: str
) -> None:
    spans = finished.calls[protocol].spans()
    names = Counter(span["name"] for span in spans)
    # five SDK calls (three plain, a stream, a retried one): six attempts, one backoff
    assert names["openai chat.completions"] == 5
    assert names["retry.backoff"] == 1
    # the six attempts, two fresh requests, the burst of six, the refused request
    assert names["POST /v1/chat/completions"] == 6 + 2 + 6 + 1
    # connections: the SDK's pool opened one (then reused it), each fresh request one, the burst
    # two; the refused request failed in connect
    assert names["http.connect"] == 1 + 2 + 2 + 1
    assert names["http.queue"] >= 1  # the burst: six requests through a pool of two
    (backoff,) = [span for span in spans if span["name"] == "retry.backoff"]
    assert backoff["attributes"]["llm_latency.backoff.reason"] == "429"
    attempts = [span for span in spans if span["name"] == "POST /v1/chat/completions"]
    (refused,) = [
        span for span in attempts if "http.response.status_code" not in span["attributes"]
    ]
    assert refused["status"] == "ERROR"
    assert refused["attributes"]["llm_latency.failed_phase"] == "connect"
    answered = [span for span in attempts if span is not refused]
    assert Counter(span["attributes"]["http.response.status_code"] for span in answered) == {
        200: 13,
        429: 1,
    }
    request_ids = [span["attributes"]["http.response.header.x-request-id"] for span in answered]
    assert all(request_id[0].startswith("req_") for request_id in request_ids)


# -- the Monitor tab -------------------------------------------------------------------------

#: The span metrics' histogram buckets in ms (deploy/compose/otel-collector.yaml).
BUCKETS_MS = [
    float(bucket.removesuffix("ms"))
    for bucket in yaml.safe_load((COMPOSE / "otel-collector.yaml").read_text())["connectors"][
        "span_metrics"
    ]["histogram"]["explicit"]["buckets"]
]


def monitor(run: Run, metric: str, service: str, **params: Any) -> dict[str, float]:
    """The last value per operation of a Monitor tab series (Jaeger's /api/metrics)."""
    now_ms = int(time.time() * 1000)
    answer = get_json(
        run.bundle.url("jaeger", 16686, f"/api/metrics/{metric}"),
        {
            "service": service,
            "spanKind": "client",
            "groupByOperation": "true",
            "endTs": now_ms,
            "lookback": 15 * 60_000,
            "step": 15_000,
            "ratePer": 600_000,
            **params,
        },
    )
    values = {}
    for series in answer["metrics"]:
        labels = {label["name"]: label["value"] for label in series["labels"]}
        points = [
            p["gaugeValue"]["doubleValue"]
            for p in series["metricPoints"]
            if "doubleValue" in p.get("gaugeValue", {})
        ]
        # an empty step is "NaN", as a string
        points = [float(value) for value in points if not math.isnan(float(value))]
        if points:
            values[labels["operation"]] = points[-1]
    return values


def bucket_index(value_ms: float) -> int:
    return bisect.bisect_left(BUCKETS_MS, value_ms)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_monitor_tab_answers_in_milliseconds_that_agree_with_the_spans(
    finished: Run, protocol: str
) -> None:
    workload = finished.calls[protocol]
    spans = workload.spans()
    operation = "POST /v1/chat/completions"
    durations = sorted(
        (span["end"] - span["start"]) / 1e6 for span in spans if span["name"] == operation
    )
    true_p95 = durations[math.ceil(0.95 * len(durations)) - 1]
    latencies = wait_for(
        lambda: monitor(finished, "latencies", workload.service, quantile=0.95),
        timeout=120,
        what="the Monitor tab's latencies",
    )
    assert abs(bucket_index(latencies[operation]) - bucket_index(true_p95)) <= 1, (
        latencies[operation],
        true_p95,
    )
    calls = wait_for(
        lambda: (rates := monitor(finished, "calls", workload.service)).get(operation) and rates,
        timeout=90,
        what="the Monitor tab's call rate",
    )
    errors = wait_for(
        lambda: (rates := monitor(finished, "errors", workload.service)).get(operation) and rates,
        timeout=90,
        what="the Monitor tab's error rate",
    )
    attempts = len(durations)
    # calls per second over the 10-minute rate window (ratePer), extrapolated by rate()
    assert calls[operation] == pytest.approx(attempts / 600, rel=0.15)
    # the share of errors: one attempt refused, one 429
    assert errors[operation] == pytest.approx(2 / attempts, abs=0.01)
    report(
        f"Monitor tab, OTLP/{protocol}: p95 {latencies[operation]:.1f} ms (spans: {true_p95:.1f} ms),"
        f" {calls[operation]:.4f} calls/s ({attempts} in 10 min), error rate {errors[operation]:.3f}"
    )


def test_the_demo_is_one_named_trace_per_scene(finished: Run) -> None:
    """``make demo`` exported to the bundle: Jaeger's trace list has one trace per scene, each
    under a root span named after its scene, and nothing outside them."""
    service = "e2e-demo"
    endpoint = finished.bundle.url("otel-collector", 4318)
    result = run_cli_process(
        "demo",
        timeout=300,
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": service},
    )
    assert result.returncode == 0, result.stderr[-3000:]

    def roots() -> dict[str, str] | None:
        traces = jaeger_traces(finished, service)
        named = {
            trace_id: span["operationName"]
            for trace_id, spans in traces.items()
            for span in spans
            if not any(ref["refType"] == "CHILD_OF" for ref in span.get("references", []))
        }
        return named if len(named) == len(traces) == len(SCENE_SPANS) else None

    found = wait_for(roots, timeout=60, what=f"the demo's {len(SCENE_SPANS)} traces in Jaeger")
    assert sorted(found.values()) == sorted(SCENE_SPANS.values())
    report(
        f"demo: {len(found)} traces in Jaeger, one per scene: {', '.join(sorted(found.values()))}"
    )


def test_jaeger_does_not_list_itself_beside_the_programs(finished: Run) -> None:
    """Jaeger's query service traces itself by default (``jaeger_query.enable_tracing``) to
    ``localhost:4317``, which in the bundle is Jaeger's own receiver: a ``jaeger`` service
    would sit in the UI's list beside the programs. After queries have been served and an
    export interval of Jaeger's tracer (5 s, the SDK's batch delay) has passed, it is not there."""
    url = finished.bundle.url("jaeger", 16686, "/api/services")
    for _ in range(3):
        jaeger_traces(finished, finished.calls["http"].service)
    time.sleep(7)
    services = get_json(url, {})["data"]
    assert finished.calls["http"].service in services
    assert "jaeger" not in services, services


def _found(run: Run, service: str, tags: dict[str, str], **params: Any) -> set[str]:
    """The trace ids Jaeger's search finds for ``tags``, as the UI's Tags box sends them."""
    answer = get_json(
        run.bundle.url("jaeger", 16686, "/api/traces"),
        {"service": service, "tags": json.dumps(tags), "limit": 1000, "lookback": "1h", **params},
    )
    return {trace["traceID"] for trace in answer["data"]}


def test_the_searches_docs_jaeger_lists_find_their_traces(finished: Run) -> None:
    """docs/jaeger.md's searches, through the query API the UI's Search form calls: a request
    id exactly as the provider sent it, the 429s, the queued attempts over a minimum duration,
    the new connections and the errors each find the traces the program exported with them."""
    workload = finished.calls["http"]
    spans = workload.spans()
    by_trace: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for span in spans:
        by_trace[span["trace_id"]].append(span)

    def traces_with(test: Any) -> set[str]:
        return {trace for trace, members in by_trace.items() if any(map(test, members))}

    def attribute(name: str) -> Any:
        return lambda span: span["attributes"].get(name)

    request_ids = {s["attributes"]["llm_latency.request_id"]: s["trace_id"] for s in spans
                   if "llm_latency.request_id" in s["attributes"]}  # fmt: skip
    assert len(request_ids) >= 5, request_ids
    for request_id, trace in list(request_ids.items())[:5]:
        found = _found(finished, workload.service, {"llm_latency.request_id": request_id})
        assert found == {trace}, request_id
    searches: list[tuple[dict[str, str], dict[str, Any], set[str]]] = [
        (
            {"http.response.status_code": "429"},
            {},
            traces_with(lambda s: s["attributes"].get("http.response.status_code") == 429),
        ),
        (
            {"llm_latency.phase": "queue"},
            {"minDuration": "1ms"},
            traces_with(lambda s: s["name"] == "http.queue" and s["end"] - s["start"] >= 1e6),
        ),
        (
            {"llm_latency.connection.reused": "false"},
            {},
            traces_with(lambda s: s["attributes"].get("llm_latency.connection.reused") is False),
        ),
        ({"error": "true"}, {}, traces_with(lambda s: s["status"] == "ERROR")),
    ]
    for tags, params, expected in searches:
        assert expected, tags  # the workload has such attempts
        assert _found(finished, workload.service, tags, **params) == expected, (tags, params)
    assert traces_with(attribute("llm_latency.queue_time")) == traces_with(
        lambda s: s["name"] == "http.queue"
    )
    counts = [
        f"{' '.join(f'{k}={v}' for k, v in tags.items())}: {len(expected)} traces"
        for tags, _, expected in searches
    ]
    report(
        f"Jaeger search, OTLP/http: {len(request_ids)} request ids each found as typed; "
        + ", ".join(counts)
    )


def test_no_exported_double_shows_float_noise(finished: Run) -> None:
    """Every double the program exported (and Jaeger shows as sent) is rounded to what it
    means: seconds to the nanosecond, rates to the thousandth (no 0.016716636000000007)."""
    doubles = [
        (span["name"], name, value)
        for protocol in PROTOCOLS
        for span in finished.calls[protocol].spans()
        for name, value in span["attributes"].items()
        if isinstance(value, float)
    ]
    assert len(doubles) > 50, doubles
    noisy = [(span, name, value) for span, name, value in doubles if value != round(value, 9)]
    assert not noisy, noisy


#: What the wall clock may differ by between the program's reading and an event's timestamp: the
#: attempt's clock is anchored to the epoch once (monotonic to wall), and Jaeger keeps
#: microseconds.
CLOCK_SLACK_NS = 1_000_000


def test_a_streams_events_fall_where_the_program_saw_them(finished: Run) -> None:
    """The streamed attempt's events, as Jaeger shows them, at the times the program itself
    measured: the first byte (the response's headers) between the call and ``create``
    returning; the first chunk within the program's wait for the first chunk the SDK yielded,
    the first token within its wait for the first chunk with text (each read happened while
    the program waited for it: nothing else reads the stream)."""
    workload = finished.calls["http"]
    marks = workload.stream_marks()
    chunks = marks["chunks"]
    first = chunks[0]
    first_text = next(chunk for chunk in chunks if chunk["content"])

    def events_of(span: dict[str, Any]) -> dict[str, int]:
        events: dict[str, int] = {}
        for log in span.get("logs", []):
            fields = {field["key"]: field["value"] for field in log["fields"]}
            events[fields["event"]] = log["timestamp"] * 1000
        return events

    def streamed() -> dict[str, int] | None:
        shown = [events_of(span) for spans in jaeger_traces(finished, workload.service).values()
                 for span in spans]  # fmt: skip
        with_byte = [events for events in shown if "llm_latency.first_byte" in events]
        return with_byte[0] if len(with_byte) == 1 else None

    events = wait_for(streamed, timeout=60, what="the streamed attempt's events in Jaeger")
    windows = {
        "llm_latency.first_byte": (marks["called"], marks["headers"]),
        "llm_latency.first_chunk": (first["asked"], first["got"]),
        "llm_latency.first_token": (first_text["asked"], first_text["got"]),
    }
    # an event comes only when later than the one before it: the first token may be the first
    # chunk's (then it has no event of its own)
    assert "llm_latency.first_byte" in events and "llm_latency.first_chunk" in events, events
    for name, at in events.items():
        low, high = windows[name]
        assert low - CLOCK_SLACK_NS <= at <= high + CLOCK_SLACK_NS, (name, at, low, high)
    shown = [
        f"{name.split('.')[-1]} at {(at - marks['called']) / 1e6:.1f} ms"
        for name, at in sorted(events.items(), key=lambda item: item[1])
    ]
    got = (first_text["got"] - marks["called"]) / 1e6
    report(
        f"Jaeger, the stream's events: {', '.join(shown)} from the call; the program got its "
        f"first text at {got:.1f} ms"
    )
