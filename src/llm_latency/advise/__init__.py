"""``llm-latency advise``: the findings service of the deploy bundle.

The Collector sends it a copy of every span before sampling (OTLP/HTTP); it keeps a bounded
sliding window of calls per service and provider host (:mod:`~llm_latency.advise.windows`),
runs :func:`~llm_latency.diagnosis.diagnose` on each every interval
(:mod:`~llm_latency.advise.advisor`) and serves the findings as Prometheus metrics
(:mod:`~llm_latency.advise.exposition`), a page and JSON (:mod:`~llm_latency.advise.page`),
from :mod:`~llm_latency.advise.server`.
"""

from __future__ import annotations

from llm_latency.advise.advisor import Advice, Advisor, Settings, Snapshot
from llm_latency.advise.server import AdviseServer

__all__ = ["Advice", "AdviseServer", "Advisor", "Settings", "Snapshot"]
