"""The tracer and the meter llm-latency's telemetry goes to, settled at the first request.

Two things can change them after ``instrument()``: the set-up at the first request (``setup``,
which may set the global providers), and providers the program sets later. The API's proxy
tracer follows such a provider, but the phase spans' fast path needs the real SDK tracer: once
a tracer provider is set, the real tracer is taken. The meter is the same, more so: the API's
proxy histograms never take the histograms' direct path (``histograms``), and the API keeps
every proxy meter for good. So llm-latency makes no instrument on a proxy meter: while no meter
provider is set (nor given), the emitter has no meter, and it gets the real one once a provider
is set (``on_meter``), at the first request after.
"""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry import metrics, trace
from opentelemetry.metrics import Meter
from opentelemetry.trace import Tracer

from llm_latency import forks, semconv
from llm_latency.setup import meter_provider_is_set, tracer_provider_is_set
from llm_latency.version import __version__


class TracerHandle:
    """Holds the current tracer; :meth:`settle` runs the first request's set-up once, trades
    the proxy tracer for the real one when a tracer provider has been set, and hands the real
    meter to ``on_meter`` when a meter provider has been set (``on_meter`` None: the meter is
    settled already)."""

    __slots__ = (
        "_follows_global",
        "_on_change",
        "_on_meter",
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
        on_meter: Callable[[Meter], None] | None = None,
    ) -> None:
        self.tracer = tracer
        self._follows_global = isinstance(tracer, trace.ProxyTracer)
        self._setup = before_first_request
        self._report = report
        self._on_change = on_change
        self._on_meter = on_meter
        # Requests that start while another thread (or greenlet) runs the set-up wait for it,
        # or their spans would go to the API's no-op tracer. Reentrant: a request the set-up
        # itself makes goes on.
        self._setting_up = forks.rlock()
        self._setup_pending = before_first_request is not None
        #: True while :meth:`settle` may still change something (the one check on the hot path).
        self.pending = self._follows_global or self._setup_pending or on_meter is not None

    def settle(self) -> Tracer:
        """Run the set-up if it has not run, take the real tracer and meter if their providers
        are now set, and return the tracer to use."""
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
        if self._on_meter is not None and meter_provider_is_set():
            on_meter, self._on_meter = self._on_meter, None
            try:
                on_meter(
                    metrics.get_meter(
                        semconv.SCOPE_NAME, __version__, schema_url=semconv.SCHEMA_URL
                    )
                )
            except Exception:
                self._report("taking the meter provider's meter")
        self.pending = self._follows_global or self._setup_pending or self._on_meter is not None
        return self.tracer
