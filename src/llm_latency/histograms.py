"""Histogram records at a fraction of the SDK's cost per record.

Through the API, each ``Histogram.record`` of the OpenTelemetry SDK builds a ``Measurement``,
cleans its attributes (a recursive copy), hashes them into an aggregation key (a recursive,
sorted walk), and finds the aggregation of that key in each reader's view of the instrument:
about two thirds of a record, and the same work for every record of the same attribute set.
llm-latency makes three to five records per finished attempt, over a handful of attribute sets
(a host, a model, a status), with attributes it builds itself from strings, integers and
booleans: already in the form the cleaning produces.

So :class:`HistogramRecorder` records an attribute set's first measurement through the API,
which creates its aggregations, then keeps those aggregation objects (one per reader and view)
and hands each later measurement of the set to them directly: the aggregation itself (buckets,
sum, min, max, under its lock) and the exemplar offer are the SDK's own. The SDK never drops an
aggregation once made, so the kept ones stay the ones the readers collect; the kept set is
dropped whenever the readers change (``_reader_storages`` is replaced, never mutated), and in a
forked child, where llm-latency drops the parent's metric points of an SDK it set up
(``lifecycle``): the aggregations kept would be the parent's, which no reader collects there.

The direct path reads the instrument's ``_measurement_consumer`` (its ``_reader_storages`` and
``_sdk_config.exemplar_filter``) and ``_meter_config`` (whether its meter is enabled), each
storage's view matches and their aggregations' ``_attributes``. It is taken only for an SDK
``Histogram`` of a release in :data:`~llm_latency.phase_spans.FAST_PATH_SDK` that has them,
and for a value the API would take (finite, not negative); anything else, or any surprise,
goes through the API, for good.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Mapping
from typing import Any, Final

from opentelemetry.context import Context
from opentelemetry.metrics import Histogram

from llm_latency import forks
from llm_latency.phase_spans import FAST_PATH_SDK, sdk_release

try:  # the SDK is a dependency, but the meter in use may be another implementation's
    from opentelemetry.sdk.metrics import (
        AlwaysOffExemplarFilter,
        AlwaysOnExemplarFilter,
        TraceBasedExemplarFilter,
    )
    from opentelemetry.sdk.metrics import Histogram as SdkHistogram
    from opentelemetry.sdk.metrics._internal import _MeterConfig
    from opentelemetry.sdk.version import __version__ as _SDK_VERSION
except ImportError:  # pragma: no cover
    SdkHistogram = None  # type: ignore[assignment,misc]
    _SDK_VERSION = ""

#: Attribute sets whose aggregations are kept at most, per histogram (beyond: the API).
MAX_KEPT: Final = 512

#: The context of a record that is to carry no trace exemplar: a context with no span. Not an
#: empty one: the SDK takes an empty (falsy) context for "the current one", whose span is the
#: program's.
NO_TRACE: Final = Context({"llm_latency.no_exemplar": True})

_Key = tuple[tuple[str, Any], ...]

_RECORDERS: weakref.WeakSet[HistogramRecorder] = weakref.WeakSet()


@forks.at_fork
def _forget_kept() -> None:
    for recorder in list(_RECORDERS):
        recorder.forget_kept()


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


def direct_path_supported(instrument: Any, sdk_version: str) -> bool:
    """Whether ``instrument`` is an SDK histogram of a tested release with what the direct
    path reads."""
    if SdkHistogram is None or not isinstance(instrument, SdkHistogram):
        return False
    release = sdk_release(sdk_version)
    first, last = FAST_PATH_SDK
    if release is None or not first <= release < last:
        return False
    consumer = getattr(instrument, "_measurement_consumer", None)
    config = getattr(consumer, "_sdk_config", None)
    meter_config = getattr(instrument, "_meter_config", False)
    return (
        (meter_config is None or isinstance(getattr(meter_config, "_config", None), _MeterConfig))
        and isinstance(getattr(consumer, "_reader_storages", None), Mapping)
        and hasattr(config, "exemplar_filter")
    )


class HistogramRecorder:
    """Records into one histogram: through the API, or straight into the aggregations of the
    attribute sets already seen (see the module's docstring). ``direct=False``: the API only."""

    def __init__(self, instrument: Histogram, direct: bool = True) -> None:
        self.instrument = instrument
        self._direct = direct and direct_path_supported(instrument, _SDK_VERSION)
        self._kept: dict[_Key, tuple[Any, ...]] = {}
        self._storages: object = None
        #: What the meter's exemplar filter answers for a record in NO_TRACE, when it is one
        #: of the SDK's, whose answer depends on the span alone; None: ask it each time.
        self._untraced_sample: bool | None = None
        #: The instrument's meter's switch (``_ProxyMeterConfig``), read on every record as the
        #: instrument's ``_is_enabled`` reads it; None: always on.
        self._meter_config: Any = None
        if self._direct:
            sdk_instrument: Any = instrument
            self._meter_config = sdk_instrument._meter_config
            exemplar_filter = type(sdk_instrument._measurement_consumer._sdk_config.exemplar_filter)
            if exemplar_filter in (TraceBasedExemplarFilter, AlwaysOffExemplarFilter):
                self._untraced_sample = False
            elif exemplar_filter is AlwaysOnExemplarFilter:
                self._untraced_sample = True
            _RECORDERS.add(self)

    @property
    def direct(self) -> bool:
        """Whether records go straight to the aggregations (else through the API)."""
        return self._direct

    def record(self, value: float, attributes: Mapping[str, Any], context: Context) -> None:
        """Record ``value`` with ``attributes`` (strings, integers, booleans) in ``context``
        (its span, when sampled, is the exemplar's trace; :data:`NO_TRACE`: no trace)."""
        if not self._direct:
            self.instrument.record(value, attributes, context)
            return
        instrument: Any = self.instrument
        consumer = instrument._measurement_consumer
        key = tuple(attributes.items())
        aggregations = self._kept.get(key)
        meter_config = self._meter_config
        if (
            aggregations is None
            or consumer._reader_storages is not self._storages
            or not 0 <= value < math.inf
            or (meter_config is not None and not meter_config._config.is_enabled)
        ):
            self.instrument.record(value, attributes, context)
            self._keep(key, attributes)
            return
        now = time.time_ns()
        sample = self._untraced_sample
        if sample is None or context is not NO_TRACE:
            sample = consumer._sdk_config.exemplar_filter.should_sample(
                value, now, attributes, context
            )
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
        instrument: Any = self.instrument
        try:
            storages = instrument._measurement_consumer._reader_storages
            if storages is not self._storages:
                self._kept.clear()
                self._storages = storages
            if len(self._kept) >= MAX_KEPT:
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
            self._direct = False
            self._kept.clear()


def _typed(attributes: Mapping[str, Any]) -> set[tuple[str, type, Any]]:
    """An attribute set compared with the value types (True and 1 are not the same value)."""
    return {(name, type(value), value) for name, value in attributes.items()}
