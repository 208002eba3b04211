"""HistogramRecorder: what its direct path records is what the API would have recorded.

Each test records the same measurements once through a recorder and once through the plain
API, into two SDK meter providers set up alike, and compares the whole exported data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import (
    AlwaysOffExemplarFilter,
    AlwaysOnExemplarFilter,
    ExemplarFilter,
    MeterProvider,
    TraceBasedExemplarFilter,
)
from opentelemetry.sdk.metrics._internal import (
    _default_meter_configurator,
    _disable_meter_configurator,
)
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import set_span_in_context

from llm_latency.histograms import NO_TRACE, HistogramRecorder

TRACES = TracerProvider().get_tracer("test")
HOSTS = ("api.openai.com", "api.anthropic.com")


def measurements() -> list[tuple[float, dict[str, Any], Context]]:
    """Values over two hosts, two statuses, a boolean and an integer of the same value (not
    the same attribute set), some with a sampled span (an exemplar) and some without (in
    llm-latency's NO_TRACE, and in another context with no span)."""
    span = TRACES.start_span("call")
    contexts = (NO_TRACE, set_span_in_context(span), Context({"no": True}), NO_TRACE)
    found = []
    for i in range(40):
        attributes: dict[str, Any] = {"server.address": HOSTS[i % 2], "status": 200 + i % 3}
        if i % 5 == 0:
            attributes["flag"] = True if i % 10 == 0 else 1
        found.append((0.01 * (i + 1), attributes, contexts[i % 4]))
    span.end()
    return found


def exported(reader: InMemoryMetricReader) -> list[tuple[Any, ...]]:
    """Every data point the reader collects, as comparable values (its exemplars too)."""
    data = reader.get_metrics_data()
    assert data is not None
    points = []
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                point: Any
                for point in metric.data.data_points:
                    exemplars = sorted(
                        (e.value, e.trace_id, tuple(sorted(e.filtered_attributes or {})))
                        for e in point.exemplars
                    )
                    points.append(
                        (
                            metric.name,
                            tuple(sorted((k, repr(v)) for k, v in point.attributes.items())),
                            point.count,
                            point.sum,
                            point.min,
                            point.max,
                            str(getattr(point, "bucket_counts", None)),
                            str(getattr(point, "positive", None)),
                            exemplars,
                        )
                    )
    return sorted(points)


def both(
    views: tuple[View, ...] = (), exemplar_filter: ExemplarFilter | None = None
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], HistogramRecorder]:
    """Record :func:`measurements` through a recorder and through the API; the two exports."""
    results = []
    recorder = None
    recorded = measurements()
    for direct in (True, False):
        reader = InMemoryMetricReader()
        provider = MeterProvider(
            metric_readers=[reader],
            views=list(views),
            exemplar_filter=exemplar_filter or TraceBasedExemplarFilter(),
        )
        histogram = provider.get_meter("m").create_histogram("h", unit="s")
        record: Callable[[float, dict[str, Any], Context], None]
        if direct:
            recorder = HistogramRecorder(histogram)
            record = recorder.record
        else:
            record = histogram.record
        for value, attributes, context in recorded:
            record(value, attributes, context)
        results.append(exported(reader))
    assert recorder is not None
    return results[0], results[1], recorder


def test_the_direct_path_records_what_the_api_does() -> None:
    direct, api, recorder = both()
    assert recorder.direct
    # Two hosts x three statuses, and the flag's boolean and integer sets apart.
    assert len(api) >= 8
    assert direct == api


class LargeValues(TraceBasedExemplarFilter):
    """A filter of the program's own: a subclass of the SDK's that also samples large values."""

    def should_sample(self, value: float, *args: Any) -> bool:
        return value > 0.3 or super().should_sample(value, *args)


@pytest.mark.parametrize(
    "exemplar_filter",
    [AlwaysOnExemplarFilter(), AlwaysOffExemplarFilter(), LargeValues()],
    ids=type,
)
def test_every_exemplar_filter_samples_as_through_the_api(
    exemplar_filter: ExemplarFilter,
) -> None:
    """The filters whose answer for a record with no span is known are not asked for the ones
    in NO_TRACE; the answer must be theirs (AlwaysOn: an exemplar with no trace), and any other
    filter is asked."""
    direct, api, recorder = both(exemplar_filter=exemplar_filter)
    assert recorder.direct
    assert direct == api
    exemplars = [e for point in api for e in point[-1]]
    if isinstance(exemplar_filter, AlwaysOffExemplarFilter):
        assert exemplars == []
    else:
        assert any(trace_id is None or trace_id == 0 for _, trace_id, _ in exemplars)


def test_a_view_that_keeps_some_attributes_and_another_aggregation() -> None:
    views = (
        View(instrument_name="h", attribute_keys={"server.address"}),
        View(
            instrument_name="h",
            name="h.exponential",
            aggregation=ExponentialBucketHistogramAggregation(),
        ),
    )
    direct, api, recorder = both(views)
    assert recorder.direct
    assert {point[0] for point in api} == {"h", "h.exponential"}
    assert direct == api


def test_a_reader_added_later_gets_every_record_after_it() -> None:
    results = []
    for direct in (True, False):
        first, later = InMemoryMetricReader(), InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[first])
        histogram = provider.get_meter("m").create_histogram("h")
        record = HistogramRecorder(histogram).record if direct else histogram.record
        attributes = {"server.address": "a"}
        for value in (1.0, 2.0, 3.0):
            record(value, attributes, Context())
        provider.add_metric_reader(later)
        for value in (4.0, 5.0):
            record(value, attributes, Context())
        results.append((exported(first), exported(later)))
    assert results[0] == results[1]
    assert results[0][1][0][2] == 2  # the later reader: the two records after it


def test_values_the_api_refuses_are_refused_alike(caplog: pytest.LogCaptureFixture) -> None:
    """Negative values are refused, with the SDK's warning (and, from SDK 1.44, values that
    are not finite), exactly as through the API."""
    results = []
    for direct in (True, False):
        reader = InMemoryMetricReader()
        histogram = MeterProvider(metric_readers=[reader]).get_meter("m").create_histogram("h")
        record = HistogramRecorder(histogram).record if direct else histogram.record
        for value in (1.0, 2.0, -1.0, float("nan"), float("inf"), 3.0):
            record(value, {"server.address": "a"}, Context())
        results.append(repr(exported(reader)))
    assert results[0] == results[1]
    assert "non-negative" in caplog.text


def test_a_meter_disabled_and_enabled_again_records_as_through_the_api() -> None:
    """A meter configurator can switch a meter off and on while the program runs: the records
    made while it is off are dropped, the ones after it count again."""
    results = []
    for direct in (True, False):
        reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[reader])
        histogram = provider.get_meter("m").create_histogram("h")
        recorder = HistogramRecorder(histogram, direct=direct)
        assert recorder.direct is direct
        attributes = {"server.address": "a"}
        for configurator, values in (
            (None, (1.0, 2.0)),
            (_disable_meter_configurator, (4.0, 8.0)),
            (_default_meter_configurator, (16.0,)),
        ):
            if configurator is not None:
                provider._set_meter_configurator(meter_configurator=configurator)
            for value in values:
                recorder.record(value, attributes, Context())
        results.append(exported(reader))
    assert results[0] == results[1]
    assert results[0][0][2:4] == (3, 19.0)  # the count and the sum: 1, 2 and 16


def test_a_meter_that_is_not_the_sdks_goes_through_the_api() -> None:
    calls = []

    class Histogram:
        def record(self, value: float, attributes: Any = None, context: Any = None) -> None:
            calls.append((value, dict(attributes)))

    recorder = HistogramRecorder(Histogram())  # type: ignore[arg-type]
    assert not recorder.direct
    recorder.record(1.5, {"a": "b"}, Context())
    recorder.record(2.5, {"a": "b"}, Context())
    assert calls == [(1.5, {"a": "b"}), (2.5, {"a": "b"})]


def test_direct_false_is_the_api_only() -> None:
    reader = InMemoryMetricReader()
    histogram = MeterProvider(metric_readers=[reader]).get_meter("m").create_histogram("h")
    recorder = HistogramRecorder(histogram, direct=False)
    assert not recorder.direct
    for value in (1.0, 2.0):
        recorder.record(value, {"a": "b"}, Context())
    assert exported(reader)[0][2] == 2
