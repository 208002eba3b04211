"""Nothing lost when a process ends: the end of a process and its forks, for an SDK that
llm-latency set up itself (``setup``), and :func:`flush` for any.

When llm-latency set the OpenTelemetry SDK up, what the SDK buffers (spans up to the batch
processor's 5 s, metrics up to the reader's 60 s) is llm-latency's to deliver. Each way a
Python process ends is reached where it can be, and each flush is bounded: ``EXIT_BUDGET_S``
when exports are failing or none has been confirmed yet (a dead collector costs about a second
and one warning line), ``WORKING_BUDGET_S`` when they work.

=================================================  =============================================
how the process ends                               where the flush runs
=================================================  =============================================
normal exit, ``sys.exit``, gunicorn sync and        ``atexit`` (gunicorn's workers leave through
gthread workers, hypercorn, spawn children          ``sys.exit``)
multiprocessing fork children (``os._exit``)        a ``multiprocessing.util.Finalize``, made
                                                    again in each child, run by multiprocessing's
                                                    own exit function
uvicorn (alone, ``--workers``, gunicorn's uvicorn   after ``uvicorn.server.Server.shutdown``:
worker), stopped by a signal                        before uvicorn restores the previous handler
                                                    and raises the signal again
Celery's prefork pool children (billiard leaves     Celery's ``worker_process_shutdown`` signal
through ``os._exit``, without finalizers)
SIGTERM with its default action (``python app.py``)  a handler, see :func:`_install_sigterm`
=================================================  =============================================

A fork child starts with nothing of its parent's: the SDK's batch queue and threads are the
SDK's own concern; the metric points the parent had not exported yet, the event-loop monitors
and (``metrics``) the tallies are dropped, and the child reports its own export failure.

None of this touches providers the program set up: those are the program's to flush and shut
down (docs/stopping.md says how); :func:`flush` flushes them too, on request.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace

from llm_latency import event_loop, forks, otel_internals, setup
from llm_latency.import_hooks import when_imported

if TYPE_CHECKING:  # the SDK is an extra: imported only where llm-latency sets it up
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    from llm_latency.export_health import ExportHealth

_logger = logging.getLogger(__name__)

#: How long the end of a process waits for the last export, unless exports are known to work.
EXIT_BUDGET_S = 1.0
#: How long it waits when exports are known to work (a large last batch, a slow link).
WORKING_BUDGET_S = 5.0
#: The default of :func:`flush`.
FLUSH_TIMEOUT_S = 1.0


@dataclass
class _Owned:
    """The SDK llm-latency set up in this process (or in a parent before a fork)."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    health: ExportHealth
    #: The process that has already flushed and shut the providers down at its end.
    ended_in: int | None = None


_owned: _Owned | None = None
#: The providers passed to ``instrument()``, flushed by :func:`flush` (None: the global ones).
_given: tuple[Any, Any] = (None, None)
_end_lock = forks.rlock()
#: The end of this process under way (a thread running :func:`_shut_down`).
_ending: threading.Thread | None = None


def use_providers(tracer_provider: Any, meter_provider: Any) -> None:
    """``instrument()`` was given these providers: :func:`flush` flushes them."""
    global _given
    _given = (tracer_provider, meter_provider)


def own(
    tracer_provider: TracerProvider, meter_provider: MeterProvider, health: ExportHealth
) -> None:
    """llm-latency set these providers up: deliver what they hold at every end of the process."""
    global _owned
    _owned = _Owned(tracer_provider, meter_provider, health)
    atexit.register(end_of_process)
    _finalize_with_multiprocessing()
    _hook_uvicorn()
    _hook_celery()
    _install_sigterm()


def end_of_process() -> None:
    """Flush and shut the providers llm-latency set up down, once per process, within the
    budget (past it, what is left is dropped). Never raises.

    A second end while the first is under way (a SIGTERM that arrives during the ``atexit``
    flush: hypercorn's master terminates the workers still stopping) waits for the first,
    instead of letting the process die in the middle of it."""
    global _ending
    owned = _owned
    if owned is None:
        return
    with _end_lock:  # reentrant: a signal handler may run in the thread that holds it
        if owned.ended_in != os.getpid():
            owned.ended_in = os.getpid()
            _ending = threading.Thread(
                target=_shut_down, args=(owned,), name="llm-latency-end", daemon=True
            )
            _ending.start()
        ending = _ending
    if ending is not None:
        ending.join(WORKING_BUDGET_S + 1.0)  # shut_down keeps within its budget


def _shut_down(owned: _Owned) -> None:
    try:
        owned.health.shut_down(
            owned.tracer_provider, owned.meter_provider, EXIT_BUDGET_S, WORKING_BUDGET_S
        )
    except Exception:  # at the very end of the process: report, never raise
        _logger.warning("llm-latency: could not flush at exit", exc_info=True)


def flush(timeout: float = FLUSH_TIMEOUT_S) -> bool:
    """Export what is buffered now, waiting at most ``timeout`` seconds; True when it all went.

    For jobs and serverless handlers that freeze between invocations, where nothing ends the
    process: call it at the end of each invocation. It flushes the providers llm-latency's
    spans and metrics go to: those given to ``instrument()``, else the global ones (set up by
    the program or by llm-latency). An unreachable collector costs ``timeout`` once (later
    flushes return False at once while the exporters still wait on it) and, when llm-latency
    set the SDK up, one warning line for the life of the process.
    """
    owned = _owned
    providers: list[object]
    if owned is not None and _given == (None, None):
        providers = [owned.tracer_provider, owned.meter_provider]
    else:
        given_tracer, given_meter = _given
        providers = [
            given_tracer or trace.get_tracer_provider(),
            given_meter or metrics.get_meter_provider(),
        ]
    found = (getattr(p, "force_flush", None) for p in providers)
    flushes: list[Callable[[], object]] = [call for call in found if callable(call)]
    done = _within(timeout, flushes)
    if not done and owned is not None:
        owned.health.timed_out(timeout)
    return done


_stuck: threading.Thread | None = None


def _within(timeout: float, calls: list[Callable[[], object]]) -> bool:
    """Run ``calls`` one after the other in a thread; whether they ended within ``timeout``.

    While an earlier flush is still waiting on the exporters (the collector is down), a new
    one could only wait behind it: it returns False at once, and what it would have sent goes
    with a later flush, or at the end of the process."""
    global _stuck
    if _stuck is not None and _stuck.is_alive():
        return False
    results: list[object] = []

    def run() -> None:
        for call in calls:
            try:
                results.append(call())
            except Exception:
                results.append(False)
                _logger.debug("llm-latency: flush failed", exc_info=True)

    worker = threading.Thread(target=run, name="llm-latency-flush", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        _stuck = worker
        return False
    return all(result is not False for result in results)


# -- where each end of a process is reached ---------------------------------------------------


def _finalize_with_multiprocessing() -> None:
    """Fork children of multiprocessing leave through ``os._exit`` after its own finalizers;
    a child clears the finalizers it inherited, then runs its after-fork callbacks."""
    import multiprocessing.util

    multiprocessing.util.Finalize(None, end_of_process, exitpriority=10)
    if _owned is not None:
        multiprocessing.util.register_after_fork(_owned, _finalize_in_child)


def _finalize_in_child(_owned_here: object) -> None:
    import multiprocessing.util

    multiprocessing.util.Finalize(None, end_of_process, exitpriority=10)


def _hook_uvicorn() -> None:
    """uvicorn stopped by a signal shuts down gracefully, puts the previous handler back and
    raises the signal again: with the default handler, the process dies without ``atexit``.
    The flush rides on its shutdown, before that."""
    when_imported("uvicorn.server", _patch_uvicorn)


_uvicorn_patches: list[Any] = []


def _patch_uvicorn(_module: object) -> None:
    from llm_latency.adapters._hooks import Hook
    from llm_latency.adapters._patching import PatchSet

    if _uvicorn_patches:
        return

    def report(where: str) -> None:
        _logger.warning("llm-latency: fault in %s", where, exc_info=True)

    def after_shutdown(_state: object, result: object) -> object:
        if _owned is not None:
            flush(WORKING_BUDGET_S if _owned.health.working else EXIT_BUDGET_S)
        return result

    patches = PatchSet("uvicorn", report)
    hook = Hook(lambda _instance, _args, _kwargs: None, after_shutdown)
    if patches.group("flush at shutdown", [("uvicorn.server:Server", "shutdown", hook)]):
        _uvicorn_patches.append(patches)
    else:
        _logger.warning(
            "llm-latency: what is buffered when uvicorn is stopped by a signal may be lost (%s)",
            "; ".join(patches.lost),
        )


def _hook_celery() -> None:
    """Celery's prefork children (billiard) leave through ``os._exit`` without running any
    finalizer; Celery sends ``worker_process_shutdown`` in the child just before."""
    when_imported("celery.signals", _connect_celery)


def _connect_celery(module: Any) -> None:
    def shutting_down(**_kwargs: object) -> None:
        end_of_process()

    module.worker_process_shutdown.connect(
        shutting_down, weak=False, dispatch_uid="llm_latency.lifecycle"
    )


def _install_sigterm() -> None:
    """A plain program stopped by SIGTERM dies at once, without ``atexit``. When SIGTERM has
    its default action (the program set no handler), llm-latency sets one that flushes within
    the budget, puts the default action back and raises SIGTERM again: the process dies of
    SIGTERM, with the exit status it would have had. Only from the main thread (Python's rule);
    a handler the program sets later replaces it."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # not the main interpreter, or no such signal here
        return


def _on_sigterm(signum: int, _frame: FrameType | None) -> None:
    end_of_process()
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


# -- forks ------------------------------------------------------------------------------------


@forks.at_fork
def _after_fork_in_child() -> None:
    global _stuck, _ending
    _stuck = _ending = None
    event_loop.stop_all()  # the parent's monitors: the child's loops get new ones
    owned = _owned
    if owned is None:
        return
    owned.ended_in = None
    owned.health.after_fork()
    _forget_metric_points(owned.meter_provider)


def _forget_metric_points(meter_provider: Any) -> None:
    """Drop the metric points a forked child inherited: they are the parent's to export (the
    SDK restarts its threads and clears its span queue in a child, but keeps these)."""
    try:
        otel_internals.forget_metric_points(meter_provider)
    except Exception:  # the SDK's layout changed: report once, keep going
        _logger.warning(
            "llm-latency: a forked process may export its parent's metric points again "
            "(this OpenTelemetry SDK's metric storage is not the one llm-latency knows)"
        )


setup.WHEN_SET_UP.append(own)
