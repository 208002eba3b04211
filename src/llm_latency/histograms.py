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
dropped whenever the readers change (the SDK replaces their storage, never mutates it), and in a
forked child, where llm-latency drops the parent's metric points of an SDK it set up
(``lifecycle``): the aggregations kept would be the parent's, which no reader collects there.

The direct path (:class:`~llm_latency.otel_internals.DirectHistogram`, where the SDK's private
names it reads are) is taken only for an SDK ``Histogram`` of a release the gate of
:mod:`llm_latency.otel_internals` lets through, and for a value the API would take (finite,
not negative); anything else, or any surprise, goes through the API, for good.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any, Final

from opentelemetry.context import Context
from opentelemetry.metrics import Histogram

from llm_latency import forks, otel_internals

#: Attribute sets whose aggregations are kept at most, per histogram (beyond: the API).
MAX_KEPT: Final = 512

#: The context of a record that is to carry no trace exemplar: a context with no span. Not an
#: empty one: the SDK takes an empty (falsy) context for "the current one", whose span is the
#: program's.
NO_TRACE: Final = Context({"llm_latency.no_exemplar": True})

_RECORDERS: weakref.WeakSet[HistogramRecorder] = weakref.WeakSet()


@forks.at_fork
def _forget_kept() -> None:
    for recorder in list(_RECORDERS):
        recorder.forget_kept()


class HistogramRecorder:
    """Records into one histogram: through the API, or straight into the aggregations of the
    attribute sets already seen (see the module's docstring). ``direct=False``: the API only.

    ``record(value, attributes, context)`` records ``value`` with ``attributes`` (strings,
    integers, booleans) in ``context`` (its span, when sampled, is the exemplar's trace;
    :data:`NO_TRACE`: no trace): the instrument's own ``record``, or the direct path's."""

    record: Callable[[float, Mapping[str, Any], Context], None]

    def __init__(self, instrument: Histogram, direct: bool = True) -> None:
        self.instrument = instrument
        self._direct = (
            otel_internals.direct_histogram(instrument, NO_TRACE, MAX_KEPT) if direct else None
        )
        if self._direct is None:
            self.record = instrument.record
        else:
            self.record = self._direct.record
            _RECORDERS.add(self)

    @property
    def direct(self) -> bool:
        """Whether records go straight to the aggregations (else through the API)."""
        return self._direct is not None and self._direct.direct

    def forget_kept(self) -> None:
        """Drop the aggregations kept: each attribute set's next record goes through the API,
        and keeps the aggregation that record went to."""
        if self._direct is not None:
            self._direct.forget()
