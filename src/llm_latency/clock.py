"""The one monotonic clock of every attempt's readings (``Timeline``, the event-loop monitor)."""

from __future__ import annotations

import time

#: The clock of every Timeline reading (monotonic, ns).
clock_ns = time.perf_counter_ns
