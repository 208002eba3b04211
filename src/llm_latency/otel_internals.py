"""OpenTelemetry's private internals that llm-latency reads: all of them here, behind one gate.

The fast paths (docs/overhead.md) write what the SDK would have written at a fraction of its
cost, handing finished spans to a tracer's span processor and measurements to the aggregations
the SDK made: they read SDK objects the public API does not show. Every private name of the
OpenTelemetry SDK or API that llm-latency reads is read here and nowhere else
(``tests/test_otel_internals.py`` scans ``src/``); the other modules call what this one offers,
bound once per tracer or histogram, so that the hot paths pay no call for it.

The gate: a fast path is taken only with an SDK release in :data:`FAST_PATH_SDK`, the releases
CI proves each one against its public path on (``constraints/oldest.txt``'s to the newest), and
only when the objects have what it reads. Outside, each takes the public path its tests compare
it with:

- phase spans and the request span written finished (``phase_spans``, ``late_spans``): the
  tracer's scope, span limits, switch and span metrics, the SDK's live span class, the span
  processors' members and ``_on_ending``; else ``Tracer.start_span``;
- a request span's end attributes, written into a live SDK span's attribute mapping under its
  locks; else ``Span.set_attributes``;
- histogram records (``histograms``): the instrument's measurement consumer (its readers'
  storages, its exemplar filter), its meter's switch, each storage's view matches and their
  aggregations; else ``Histogram.record``.

The other reads are no fast path but the only way to do their job, on any release, and fail as
they always did when the layout is not the one they know: a forked child's inherited metric
points (else ``lifecycle`` warns that the child may export them again), the program's spans
held before the set-up (``ProxyTracer._tracer``; else nothing is held), whether a meter provider
is set, the set-up's exporters, sampler and id generator (as ``opentelemetry-instrument`` finds
them), a wrapped metric exporter's preferences and an exporter's endpoint.
"""

from __future__ import annotations

import inspect
import math
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.context import Context

try:  # the SDK is an extra, and the tracer and meter in use may be another implementation's
    from opentelemetry.attributes import BoundedAttributes
    from opentelemetry.sdk.metrics import (
        AlwaysOffExemplarFilter,
        AlwaysOnExemplarFilter,
        TraceBasedExemplarFilter,
    )
    from opentelemetry.sdk.metrics import Histogram as _SdkHistogram
    from opentelemetry.sdk.metrics._internal import _MeterConfig
    from opentelemetry.sdk.trace import SpanProcessor, _Span
    from opentelemetry.sdk.trace import Tracer as _SdkTracer
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.version import __version__ as SDK_VERSION

    #: The SDK's own processors, whose ``on_start`` and ``_on_ending`` do nothing.
    _SILENT_AT_START: frozenset[Any] = frozenset(
        getattr(kind, hook, None)
        for kind in (SpanProcessor, BatchSpanProcessor, SimpleSpanProcessor)
        for hook in ("on_start", "_on_ending")
    )
except ImportError:  # pragma: no cover
    _SdkTracer = _SdkHistogram = _Span = None  # type: ignore[assignment,misc]
    SDK_VERSION = ""
    _SILENT_AT_START = frozenset()

#: The SDK's live span, what ``Tracer.start_span`` makes.
LiveSpan = _Span

#: The OpenTelemetry SDK releases the fast paths are proven against: ``[first, last)`` (major,
#: minor). Outside, each takes the public API.
FAST_PATH_SDK: Final = ((1, 43), (2, 0))


def is_tested_release(version: str | None = None) -> bool:
    """Whether the installed SDK (or ``version``) is a release the fast paths are proven on."""
    parts = (SDK_VERSION if version is None else version).split(".")
    try:
        release = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return False
    first, last = FAST_PATH_SDK
    return first <= release < last


# -- spans --------------------------------------------------------------------------------------


class TracerParts:
    """What the span fast paths read of an SDK tracer, bound once (each is fixed for the
    tracer's life; what may change, such as its ``resource``, is read from :attr:`tracer`)."""

    __slots__ = ("is_enabled", "limits", "scope", "tracer", "tracer_metrics")

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer
        self.scope = tracer._instrumentation_scope
        self.limits = tracer._span_limits
        #: ``()``: whether the tracer is on now (its configurator may switch it). A bound
        #: method kept in a slot: read it, then call it (``sdk.is_enabled()`` would not be
        #: specialized as a method call is).
        self.is_enabled = tracer._is_enabled
        #: The SDK's span metrics: ``start_span(parent, decision)`` counts a started span and
        #: returns what counts its end.
        self.tracer_metrics = tracer._tracer_metrics


def tracer_parts(tracer: trace.Tracer) -> TracerParts | None:
    """``tracer``'s parts for the span fast paths, or None (the public API) unless it is an SDK
    tracer, of a tested release, with what they read."""
    if _SdkTracer is None or not isinstance(tracer, _SdkTracer) or not is_tested_release():
        return None
    if not all(hasattr(tracer, field) for field in ("id_generator", "resource", "sampler")):
        return None
    try:
        return TracerParts(tracer)
    except AttributeError:
        return None


def set_clean_attributes(span: Any, attributes: dict[str, Any]) -> None:
    """``span.set_attributes(attributes)``, for values already as the SDK keeps them (str, bool,
    int, float, tuples of those): into a live SDK span's attribute mapping under its locks
    (skipping the SDK's cleaning, which would copy each value to the same) when the whole set
    fits its limits (no value-length limit, room for every attribute); else ``set_attributes``."""
    if type(span) is LiveSpan:
        kept = span._attributes
        if (
            type(kept) is BoundedAttributes
            and kept.max_value_len is None
            and (kept.maxlen is None or len(kept) + len(attributes) <= kept.maxlen)
        ):
            with span._lock:
                if span._end_time is None:
                    with kept._lock:
                        kept._dict.update(attributes)
                    return
    span.set_attributes(attributes)


class StartListeners:
    """Whether any span processor of an SDK tracer acts when a span starts or is ending
    (``on_start``, ``_on_ending``): decided once per set of processors (the SDK replaces its
    tuple of processors when one is added)."""

    def __init__(self, tracer: Any) -> None:
        self._processor = getattr(tracer, "span_processor", None)
        self._seen: object = _NOT_SEEN
        self._listening = True

    def listening(self) -> bool:
        """True when a request span must be a live SDK span for the processors to see it."""
        processors = getattr(self._processor, "_span_processors", None)
        if processors is not self._seen:
            self._seen = processors
            self._listening = processors is None or any(map(_listens, processors))
        return self._listening


_NOT_SEEN: Any = object()


def _listens(processor: Any) -> bool:
    inner = getattr(processor, "_span_processors", None)
    if inner is not None:  # a multi-processor: its members say
        return any(map(_listens, inner))
    kind = type(processor)
    return not all(
        getattr(kind, hook, None) in _SILENT_AT_START for hook in ("on_start", "_on_ending")
    )


# -- histograms ---------------------------------------------------------------------------------


class _Measurement:
    """What an SDK aggregation and its exemplar reservoir read of a measurement: the
    ``Measurement`` dataclass without its attribute cleaning (the values are clean)."""

    __slots__ = ("attributes", "context", "instrument", "time_unix_nano", "value")

    def __init__(
        self, value: float, time_unix_nano: int, instrument: Any, context: Context, attributes: Any
    ) -> None:
        self.value = value
        self.time_unix_nano = time_unix_nano
        self.instrument = instrument
        self.context = context
        self.attributes = attributes


_Key = tuple[tuple[str, Any], ...]


class SdkHistogramRecorder:
    """Records into one histogram: where it is an SDK histogram of a tested release (and
    ``direct``), an attribute set's first record through the API, which makes its aggregations
    (one per reader and view), later ones handed to those aggregations (``histograms`` says
    why); else through the API. The kept ones are dropped when the readers change (the
    instrument's ``_reader_storages`` is replaced, never mutated) and by :meth:`forget_kept`; a
    value or meter state the API would refuse, and any surprise, goes through the API."""

    def __init__(self, instrument: Any, no_trace: Context, max_kept: int, direct: bool) -> None:
        self.instrument = instrument
        #: Whether records go straight to the aggregations (else through the API); False
        #: once the SDK surprised it.
        self.direct = direct and _direct_path_supported(instrument)
        self._no_trace = no_trace
        self._max_kept = max_kept
        self._kept: dict[_Key, tuple[Any, ...]] = {}
        self._storages: object = None
        #: What the exemplar filter answers for a record in ``no_trace`` when it is one of the
        #: SDK's, whose answer depends on the span alone; None: ask it each time.
        self._untraced_sample: bool | None = None
        if not self.direct:
            return
        self._consumer = instrument._measurement_consumer
        self._sdk_config = self._consumer._sdk_config
        #: The meter's switch (``_ProxyMeterConfig``), read on every record as the instrument's
        #: ``_is_enabled`` reads it; None: always on.
        self._meter_config = instrument._meter_config
        exemplar_filter = type(self._sdk_config.exemplar_filter)
        if exemplar_filter in (TraceBasedExemplarFilter, AlwaysOffExemplarFilter):
            self._untraced_sample = False
        elif exemplar_filter is AlwaysOnExemplarFilter:
            self._untraced_sample = True

    def record(self, value: float, attributes: Mapping[str, Any], context: Context) -> None:
        """Record ``value`` with ``attributes`` (strings, integers, booleans) in ``context``
        (its span, when sampled, is the exemplar's trace; ``no_trace``: no trace)."""
        instrument = self.instrument
        if not self.direct:
            instrument.record(value, attributes, context)
            return
        consumer = self._consumer
        key = tuple(attributes.items())
        aggregations = self._kept.get(key)
        meter_config = self._meter_config
        if (
            aggregations is None
            or consumer._reader_storages is not self._storages
            or not 0 <= value < math.inf
            or (meter_config is not None and not meter_config._config.is_enabled)
        ):
            instrument.record(value, attributes, context)
            self._keep(key, attributes)
            return
        now = time.time_ns()
        sample = self._untraced_sample
        if sample is None or context is not self._no_trace:
            sample = self._sdk_config.exemplar_filter.should_sample(value, now, attributes, context)
        measurement = _Measurement(value, now, instrument, context, attributes)
        for aggregation in aggregations:
            aggregation.aggregate(measurement, sample)

    def forget_kept(self) -> None:
        """Drop the aggregations kept: each attribute set's next record goes through the API,
        and keeps the aggregation that record went to."""
        self._kept = {}
        self._storages = None

    def _keep(self, key: _Key, attributes: Mapping[str, Any]) -> None:
        """Find and keep the aggregations the API just recorded ``attributes`` into."""
        instrument = self.instrument
        try:
            storages = self._consumer._reader_storages
            if storages is not self._storages:
                self._kept.clear()
                self._storages = storages
            if len(self._kept) >= self._max_kept:
                return
            found = []
            for storage in storages.values():
                for match in storage._get_or_init_view_instrument_match(instrument):
                    names = match._view._attribute_keys
                    wanted = _typed(
                        attributes
                        if names is None
                        else {k: v for k, v in attributes.items() if k in names}
                    )
                    aggregation = next(
                        (
                            a
                            for a in list(match._attributes_aggregation.values())
                            if _typed(a._attributes or {}) == wanted
                        ),
                        None,
                    )
                    if aggregation is None:  # not recorded (not enabled, a drop view...)
                        return
                    found.append(aggregation)
            self._kept[key] = tuple(found)
        except Exception:  # an SDK unlike the tested ones: the API from now on
            self.direct = False
            self._kept.clear()


def _typed(attributes: Mapping[str, Any]) -> set[tuple[str, type, Any]]:
    """An attribute set compared with the value types (True and 1 are not the same value)."""
    return {(name, type(value), value) for name, value in attributes.items()}


def _direct_path_supported(instrument: Any) -> bool:
    """Whether ``instrument`` is an SDK histogram, of a tested release, with what the direct
    path reads."""
    if _SdkHistogram is None or not (isinstance(instrument, _SdkHistogram) and is_tested_release()):
        return False
    consumer = getattr(instrument, "_measurement_consumer", None)
    config = getattr(consumer, "_sdk_config", None)
    meter_config = getattr(instrument, "_meter_config", False)
    return (
        (meter_config is None or isinstance(getattr(meter_config, "_config", None), _MeterConfig))
        and isinstance(getattr(consumer, "_reader_storages", None), Mapping)
        and hasattr(config, "exemplar_filter")
    )


def forget_metric_points(meter_provider: Any) -> None:
    """Drop the metric points a forked child inherited from ``meter_provider``'s storages, with
    new locks (the parent's may have been held at the fork). Raises when the storage is not
    the one this module knows."""
    consumer = meter_provider._measurement_consumer
    consumer._lock = threading.Lock()
    for storage in consumer._reader_storages.values():
        storage._lock = threading.RLock()
        for matches in storage._instrument_view_instrument_matches.values():
            for match in matches:
                match._lock = threading.Lock()
                match._attributes_aggregation.clear()


def is_proxy_meter_provider(provider: object) -> bool:
    """Whether ``provider`` is the API's default proxy (no meter provider set)."""
    return type(provider).__name__ == "_ProxyMeterProvider"


# -- the API's proxy tracer ----------------------------------------------------------------------

#: What a ``ProxyTracer`` keeps of its scope (the API's layout since 1.x).
_PROXY_SCOPE: Final = (
    "_instrumenting_module_name",
    "_instrumenting_library_version",
    "_schema_url",
    "_attributes",
)


def proxy_resolution() -> property | None:
    """How the API's ``ProxyTracer`` finds its tracer now: its ``_tracer`` property, or None
    when it has none or keeps its scope otherwise than :func:`proxy_scope` reads it."""
    found = inspect.getattr_static(trace.ProxyTracer, "_tracer", None)
    if not isinstance(found, property) or found.fget is None:
        return None
    proxy = trace.ProxyTracer("x")
    return found if all(hasattr(proxy, field) for field in _PROXY_SCOPE) else None


def set_proxy_resolution(resolution: property | None) -> None:
    """Make ``resolution`` how every ``ProxyTracer`` finds its tracer."""
    setattr(trace.ProxyTracer, "_tracer", resolution)  # noqa: B010


def proxy_scope(proxy: Any) -> tuple[Any, Any, Any, Any]:
    """``proxy``'s name, version, schema URL and attributes, as ``get_tracer`` takes them."""
    return (
        proxy._instrumenting_module_name,
        proxy._instrumenting_library_version,
        proxy._schema_url,
        proxy._attributes,
    )


# -- the SDK's configuration from OTEL_* and its exporters --------------------------------------


def exporter_classes(
    traces: Sequence[str], metrics: Sequence[str]
) -> tuple[dict[str, type], dict[str, type]]:
    """The span and metric exporter classes registered under these entry-point names, found as
    ``opentelemetry-instrument`` finds them. Raises ImportError without the SDK."""
    from opentelemetry.sdk._configuration import _import_exporters

    spans, metric_exporters, _ = _import_exporters(list(traces), list(metrics), [])
    return spans, metric_exporters


def sampler_and_id_generator() -> tuple[Any, Any]:
    """The sampler and id generator ``OTEL_TRACES_SAMPLER`` and ``OTEL_PYTHON_ID_GENERATOR``
    name, as the SDK reads them. Raises ImportError without the SDK."""
    from opentelemetry.sdk._configuration import (
        _get_id_generator,
        _get_sampler,
        _import_id_generator,
        _import_sampler,
    )

    return _import_sampler(_get_sampler()), _import_id_generator(_get_id_generator())


def exporter_preferences(exporter: Any) -> tuple[Any, Any]:
    """A metric exporter's preferred temporality and aggregation, as it was made with."""
    return exporter._preferred_temporality, exporter._preferred_aggregation


def exporter_endpoint(exporter: object) -> str | None:
    """Where an OTLP exporter sends (None: it does not say)."""
    return getattr(exporter, "_endpoint", None)
