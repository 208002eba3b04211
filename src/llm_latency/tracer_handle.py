"""The tracer llm-latency's spans go to, settled at the first request.

Two things can change it after ``instrument()``: the set-up at the first request (``setup``,
which may set the global providers), and a tracer provider the program sets later. The API's
proxy tracer follows such a provider, but the phase spans' fast path needs the real SDK tracer:
once a provider is set, the real tracer is taken.
"""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry import trace
from opentelemetry.trace import Tracer

from llm_latency import forks, semconv
from llm_latency.setup import tracer_provider_is_set
from llm_latency.version import __version__


class TracerHandle:
    """Holds the current tracer; :meth:`settle` runs the first request's set-up once and
    trades the proxy tracer for the real one when a provider has been set."""

    __slots__ = (
        "_follows_global",
        "_on_change",
        "_report",
        "_setting_up",
        "_setup",
        "_setup_pending",
        "pending",
        "tracer",
    )

    def __init__(
        self,
        tracer: Tracer,
        *,
        before_first_request: Callable[[], None] | None,
        report: Callable[[str], None],
        on_change: Callable[[Tracer], None],
    ) -> None:
        self.tracer = tracer
        self._follows_global = isinstance(tracer, trace.ProxyTracer)
        self._setup = before_first_request
        self._report = report
        self._on_change = on_change
        # Requests that start while another thread (or greenlet) runs the set-up wait for it,
        # or their spans would go to the API's no-op tracer. Reentrant: a request the set-up
        # itself makes goes on.
        self._setting_up = forks.rlock()
        self._setup_pending = before_first_request is not None
        #: True while :meth:`settle` may still change something (the one check on the hot path).
        self.pending = self._follows_global or self._setup_pending

    def settle(self) -> Tracer:
        """Run the set-up if it has not run, take the real tracer if a provider is now set,
        and return the tracer to use."""
        if self._setup_pending:
            with self._setting_up:
                setup, self._setup = self._setup, None
                if setup is not None:
                    try:
                        setup()
                    except Exception:
                        self._report("set-up at the first request")
                    finally:
                        self._setup_pending = False
        if self._follows_global and tracer_provider_is_set():
            self._follows_global = False
            self.tracer = trace.get_tracer(
                semconv.SCOPE_NAME, __version__, schema_url=semconv.SCHEMA_URL
            )
            self._on_change(self.tracer)
        self.pending = self._follows_global or self._setup_pending
        return self.tracer
