"""The program's own spans started before llm-latency sets the SDK up: kept, then handed over.

With no OpenTelemetry set-up of its own, a program instrumented by ``instrument()`` gets the SDK
set up at its first instrumented request, and only then (``setup``): a program that sets its
providers up later keeps them. Until then ``trace.get_tracer`` gives the program the API's proxy
tracer, whose spans are its no-op tracer's: a span the program starts around its first call
(the most natural first program) would be non-recording, never exported, with nothing to say
so, and the attempts under it the roots of traces of their own.

llm-latency cannot decide earlier that nothing else will set the SDK up: a program takes its
tracers at import, before its own set-up, and may start a span before setting its providers.
So the decision stays at the first request, and what is started meanwhile is kept: while the
set-up is pending, a proxy tracer with no provider set behind it starts its spans on a
provisional SDK tracer provider, built as the set-up builds one (resource, sampler and id
generator from ``OTEL_*``) but set nowhere, whose one span processor holds the spans that end
(at most :data:`MAX_HELD`). At the decision:

- llm-latency set the SDK up: the held spans, and the provisional ones that end later, go to its
  span processors (its exporters), under one resource; the spans started since are the real
  provider's, children of the provisional ones that were current;
- anything else (the program's own providers, ``OTEL_SDK_DISABLED``, no SDK installed, the
  instrumentation ended first): they are dropped, as the no-op tracer would have dropped them.

The API's ``ProxyTracer`` resolves its tracer in a property (read and set through
``otel_internals``); llm-latency replaces that property while the set-up is pending, and only
then (it is put back at the decision). Once a provider is set, the API's own resolution runs
unchanged, and a proxy never keeps the provisional tracer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import trace
from opentelemetry.trace import NoOpTracer, Tracer

from llm_latency import forks, live_state, otel_internals

try:  # the SDK is an extra: nothing is held without it
    from opentelemetry.sdk.trace import SpanProcessor
except ImportError:  # pragma: no cover
    SpanProcessor = object  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider

_logger = logging.getLogger(__name__)

#: Ended spans held until the decision at most (the SDK's batch queue holds as many); those
#: that end beyond are dropped.
MAX_HELD: Final = 2048


class _Gate(SpanProcessor):
    """The provisional provider's span processor: holds the spans that end until it is
    released, then passes them, and those that end later, to the processors it was given."""

    def __init__(self) -> None:
        self._lock = forks.lock()
        self._held: list[ReadableSpan] = []
        #: The processors spans go to once released (None: not yet; empty: dropped).
        self._to: Sequence[SpanProcessor] | None = None

    def __len__(self) -> int:
        return len(self._held)

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            to = self._to
            if to is None:
                if len(self._held) < MAX_HELD:
                    self._held.append(span)
                return
        for processor in to:
            processor.on_end(span)

    def release(self, processors: Sequence[SpanProcessor]) -> None:
        """Pass what is held, and every span that ends from now on, to ``processors``."""
        with self._lock:
            held, self._held = self._held, []
            self._to = tuple(processors)
        for span in held:
            for processor in self._to:
                processor.on_end(span)

    def after_fork(self) -> None:
        # What a forked child inherited is its parent's to hand over.
        self._held = []


class _Holding:
    """The provisional provider (built at the first span started while holding) and its gate."""

    def __init__(self, build: Callable[[], TracerProvider]) -> None:
        self._build: Callable[[], TracerProvider] | None = build
        self._lock = forks.lock()
        self.provider: TracerProvider | None = None
        self.gate = _Gate()

    def tracer(self, proxy: Any) -> Tracer | None:
        """The provisional provider's tracer for ``proxy``'s scope (None: the SDK is missing)."""
        with self._lock:
            if self.provider is None and self._build is not None:
                build, self._build = self._build, None
                try:
                    provider = build()
                except ImportError:  # no SDK: the first request's warning says so
                    return None
                provider.add_span_processor(self.gate)
                self.provider = provider
        if self.provider is None:
            return None
        return self.provider.get_tracer(*otel_internals.proxy_scope(proxy))


_lock = forks.lock()
_holding: _Holding | None = None
#: The API's own resolution of a ``ProxyTracer``'s tracer, put back at the decision.
_api_property: property | None = None
_failed = False


def _resolve(proxy: Any) -> Tracer:
    """A ``ProxyTracer``'s tracer while holding: the API's answer, unless it is the no-op
    tracer because no provider is set, then the provisional provider's tracer."""
    global _failed
    api = _api_property
    tracer: Tracer = api.fget(proxy) if api is not None and api.fget is not None else NoOpTracer()
    holding = _holding
    if (
        holding is None
        or not isinstance(tracer, NoOpTracer)
        or not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    ):
        return tracer
    try:
        return holding.tracer(proxy) or tracer
    except Exception:  # never break the program: its span is the no-op one, as without us
        if not _failed:
            _failed = True
            _logger.warning(
                "llm-latency: the program's spans before the first request are not kept",
                exc_info=True,
            )
        return tracer


def hold(build: Callable[[], TracerProvider]) -> None:
    """Keep the spans started through the API's proxy tracers from now until :func:`hand_over`
    or :func:`drop`, on a provider ``build`` makes at the first of them. Nothing is held
    where the API's ``ProxyTracer`` is not the one this module knows."""
    global _holding, _api_property
    with _lock:
        if _holding is not None:
            return
        api = otel_internals.proxy_resolution()
        if api is None:
            return
        _api_property = api
        _holding = _Holding(build)
        otel_internals.set_proxy_resolution(property(_resolve))


def _stop() -> _Holding | None:
    global _holding
    with _lock:
        holding, _holding = _holding, None
        ours = otel_internals.proxy_resolution()
        if holding is not None and ours is not None and ours.fget is _resolve:
            otel_internals.set_proxy_resolution(_api_property)
        return holding


def resource() -> Any:
    """The provisional provider's resource (the held spans'), or None when none was built:
    the set-up makes its provider with it, so that every span has one resource."""
    holding = _holding
    return None if holding is None or holding.provider is None else holding.provider.resource


def hand_over(processors: Sequence[SpanProcessor]) -> None:
    """llm-latency set the SDK up: the held spans, and those started before that end later,
    go to ``processors``. Stops holding."""
    holding = _stop()
    if holding is not None:
        holding.gate.release(processors)


def drop() -> None:
    """Nothing of llm-latency's will export them: drop the held spans, and those started
    before that end later. Stops holding. Does nothing when not holding."""
    holding = _stop()
    if holding is not None:
        holding.gate.release(())


@forks.at_fork
def _after_fork_in_child() -> None:
    holding = _holding
    if holding is not None:
        holding.gate.after_fork()


live_state.register("held_spans", lambda: 0 if _holding is None else len(_holding.gate))
