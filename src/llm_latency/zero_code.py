"""``opentelemetry-instrument`` without an OpenTelemetry distro: say once why there are no spans.

``opentelemetry-instrument`` turns llm-latency on through its entry point, but configuring the
SDK is the distro's job (``opentelemetry-distro``): without one, the instrumentations run and
every span goes to the API's no-op provider. At the first instrumented request, if by then no
tracer provider and no meter provider has been set, one warning line says so and what to do.
"""

from __future__ import annotations

import logging

from llm_latency.setup import meter_provider_is_set, tracer_provider_is_set

_logger = logging.getLogger(__name__)

WARNING = (
    "llm-latency: no OpenTelemetry SDK was set up, so there are no spans: "
    "pip install opentelemetry-distro (opentelemetry-instrument configures the SDK through it)"
)


def warn_if_unconfigured() -> None:
    """Called once, before the first instrumented request of an instrumentation that was not
    started by :func:`llm_latency.instrument` (which sets the SDK up itself, or was told not to)."""
    if not tracer_provider_is_set() and not meter_provider_is_set():
        _logger.warning(WARNING)
