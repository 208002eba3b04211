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

The direct path (:class:`~llm_latency.otel_internals.SdkHistogramRecorder`, where the SDK's private
names it reads are) is taken only for an SDK ``Histogram`` of a release the gate of
:mod:`llm_latency.otel_internals` lets through, and for a value the API would take (finite,
not negative); anything else, or any surprise, goes through the API, for good.
"""

from __future__ import annotations

import weakref
from typing import Final

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


class HistogramRecorder(otel_internals.SdkHistogramRecorder):
    """Records into one histogram: through the API, or straight into the aggregations of the
    attribute sets already seen (see the module's docstring). ``direct=False``: the API only.
    ``record(value, attributes, context)`` takes strings, integers and booleans as attribute
    values; the context's span, when sampled, is the exemplar's trace (:data:`NO_TRACE`: no
    trace)."""

    def __init__(self, instrument: Histogram, direct: bool = True) -> None:
        super().__init__(instrument, NO_TRACE, MAX_KEPT, direct)
        if self.direct:
            _RECORDERS.add(self)
