"""A gunicorn configuration file with docs/stopping.md's recipe for a program that set the SDK
up itself: each worker shuts its providers down (flushing them) as it exits.

    gunicorn -c tests/programs/gunicorn_flush.py tests.programs.own_sdk:wsgi
"""

from __future__ import annotations

from typing import Any

from opentelemetry import metrics, trace


def worker_exit(server: Any, worker: Any) -> None:
    """The recipe."""
    trace.get_tracer_provider().shutdown()  # type: ignore[attr-defined]
    metrics.get_meter_provider().shutdown()  # type: ignore[attr-defined]
