"""The observable instruments (counters and gauges read when the SDK collects), created once per
meter and reading the live instrumentation.

The SDK registers an instrument once per meter: creating one again with the same name returns
the one already registered, with its first callbacks, and drops the new ones. A meter outlives
an instrumentation (the program's meter provider serves ``uninstrument()`` then
``instrument()``), so callbacks bound to one instrumentation's tallies would report the first
instrumentation's frozen counts for good, and the next one's never. So each meter gets its
observable instruments once (:func:`observed_on`), whose callbacks read through
:class:`Observed`'s slot: what the live instrumentation plugs in (its tallies, its pools) and
takes out when it ends. An ended instrumentation's counters go on reporting their final totals
(what it counted since the SDK last collected is exported at the provider's shutdown, which a
program runs after ``uninstrument()``), its gauges and pool metrics nothing (what they describe
is no longer watched); the next instrumentation reports its own.

Kept weakly by the meter: the meter's instruments hold their :class:`Observed`, nothing here
holds the meter, and a dropped meter provider leaves nothing behind.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from llm_latency import forks, live_state, semconv

#: Reads one instrument's observations when the SDK collects.
Observer = Callable[[CallbackOptions], Iterable[Observation]]

#: Each observable instrument: its kind, name, unit and description.
INSTRUMENTS: Final = (
    (
        "counter",
        semconv.RETRIES,
        "{retry}",
        "Attempts that were retried, by what caused the retry.",
    ),
    ("counter", semconv.RATE_LIMITED, "{response}", "Responses with status 429."),
    (
        "counter",
        semconv.CONNECTIONS,
        "{attempt}",
        "Attempts, by whether they ran on a pooled (reused) connection.",
    ),
    (
        "gauge",
        semconv.RATELIMIT_REMAINING,
        "{unit}",
        "Requests or tokens left in the current rate-limit window.",
    ),
    (
        "up_down_counter",
        semconv.HTTP_CLIENT_OPEN_CONNECTIONS,
        "{connection}",
        "Connections open in the program's HTTP connection pools, by state: active (carrying "
        "a request) or idle (kept alive for the next one).",
    ),
    (
        "gauge",
        semconv.POOL_LIMIT,
        "{connection}",
        "The most connections the program's pools may open to the host.",
    ),
    (
        "up_down_counter",
        semconv.POOL_WAITING,
        "{request}",
        "Requests waiting for a connection from the pool (phase http.queue).",
    ),
    (
        "up_down_counter",
        semconv.HTTP_CLIENT_ACTIVE_REQUESTS,
        "{request}",
        "HTTP requests in flight, those waiting for a connection included.",
    ),
)

_NOTHING: Mapping[str, Observer] = {}

#: The cumulative counters: an ended instrumentation's totals stay true, so they stay reported.
COUNTERS: Final = frozenset(name for kind, name, _, _ in INSTRUMENTS if kind == "counter")


class Observed:
    """The observable instruments of one meter, reporting what the instrumentation plugged in
    reads (one at a time: llm-latency has one live instrumentation)."""

    def __init__(self, meter: Meter) -> None:
        self._owner: object = None
        self._observers = _NOTHING
        create = {
            "counter": meter.create_observable_counter,
            "gauge": meter.create_observable_gauge,
            "up_down_counter": meter.create_observable_up_down_counter,
        }
        for kind, name, unit, description in INSTRUMENTS:
            create[kind](name, [self._reading(name)], unit=unit, description=description)

    def _reading(self, name: str) -> Observer:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            observer = self._observers.get(name)
            return () if observer is None else observer(options)

        return observe

    def plug(self, owner: object, observers: Mapping[str, Observer]) -> None:
        """From now on, report what ``observers`` read (by instrument name) for ``owner``."""
        self._owner, self._observers = owner, dict(observers)

    def unplug(self, owner: object) -> None:
        """``owner`` ended (unless another owner was plugged in since): report its counters'
        totals, which no longer change, and nothing of its gauges and pools."""
        if self._owner is owner:
            kept = {name: read for name, read in self._observers.items() if name in COUNTERS}
            self._owner, self._observers = None, kept


_BY_METER: weakref.WeakKeyDictionary[Meter, Observed] = weakref.WeakKeyDictionary()
_lock = forks.lock()


def observed_on(meter: Meter) -> Observed:
    """The observable instruments of ``meter``, created at its first call."""
    with _lock:
        try:
            found = _BY_METER.get(meter)
        except TypeError:  # a meter that cannot be referenced weakly: instruments each time
            return Observed(meter)
        if found is None:
            found = _BY_METER[meter] = Observed(meter)
        return found


live_state.register("meters", lambda: len(_BY_METER))
