"""One at-fork list for the whole package: a forked child starts with none of its parent's
in-process state, and with every lock free.

A child of ``os.fork`` (gunicorn's and Celery's workers, multiprocessing's fork start method)
copies the parent's memory at the moment of the fork, with one thread: the one that forked.

- What the parent was in the middle of is not the child's: its attempts in flight (counted by
  ``http.client.active_requests`` until they end, which in the child they never do), its event
  loops' monitors, its tallies and, for an SDK llm-latency set up, its unexported metric points.
  Each owner of such a registry hands :func:`at_fork` the function that empties it.
- A lock another thread of the parent held at the fork (the SDK's reader thread collecting the
  pool metrics, a request opening a connection) stays held in the child, by a thread that does
  not exist there: the child's first use of it would wait forever. Every lock llm-latency keeps
  beyond one call is made by :func:`lock` or :func:`rlock`, which the child frees again, or is
  replaced by its owner's callback (the tallies', the SDK's metric storage llm-latency set up).

The callbacks run in the order they were registered, each once in each child, before the child
runs anything else; one that fails is logged and the others still run.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

_logger = logging.getLogger(__name__)

_Callback = TypeVar("_Callback", bound=Callable[[], object])

_callbacks: list[Callable[[], object]] = []
# Weak: a lock goes with the object that owns it.
_locks: weakref.WeakSet[Any] = weakref.WeakSet()


def at_fork(callback: _Callback) -> _Callback:
    """Run ``callback()`` in every forked child, before it runs anything else (usable as a
    decorator). For a module's registry: register once, at import."""
    _callbacks.append(callback)
    return callback


def lock() -> threading.Lock:
    """A ``threading.Lock`` that is free again in a forked child."""
    made = threading.Lock()
    _locks.add(made)
    return made


def rlock() -> threading.RLock:
    """A ``threading.RLock`` that is free again in a forked child."""
    made = threading.RLock()
    _locks.add(made)
    return made


def _after_fork_in_child() -> None:
    for held in list(_locks):
        # What the threading module does for its own locks in a child (CPython 3.9 and later).
        reinit = getattr(held, "_at_fork_reinit", None)
        if reinit is not None:
            reinit()
    for callback in list(_callbacks):
        try:
            callback()
        except Exception:
            _logger.warning(
                "llm-latency: a forked process may keep its parent's state (%s)",
                getattr(callback, "__qualname__", callback),
                exc_info=True,
            )


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
