"""A small public view of the state llm-latency keeps alive in this process.

Everything the plugin keeps beyond one request (per event loop, thread, pool, instrumentation or
attribute set) is owned by the lifetime of what it describes: a closed loop, an ended thread, a
dropped pool or an ended instrumentation leaves nothing behind. :func:`live_state` counts what
is alive now, for support ("is the plugin holding my loops?") and for the tests that hold the
plugin to those lifetimes, without anyone reading private names.

Each owner of such state registers one counting function here at its import
(:func:`register`); counting never changes what it counts.
"""

from __future__ import annotations

from collections.abc import Callable

_COUNTS: dict[str, Callable[[], int]] = {}


def register(name: str, count: Callable[[], int]) -> None:
    """``count()`` says how many of ``name`` are alive now (a module's own registry size)."""
    _COUNTS[name] = count


def live_state() -> dict[str, int]:
    """How many of each kind of long-lived object llm-latency holds now, by name (for example
    ``loop_monitors``: event loops watched for lag). A kind with nothing alive reads 0."""
    return {name: count() for name, count in sorted(_COUNTS.items())}
