"""The fault log: a fault inside the plugin is logged once per instrumentation, and the program
goes on.

Every part of llm-latency that runs inside the program's calls (the hooks, the emitter, the retry
helper) catches what goes wrong in its own code and hands it to its instrumentation's
:class:`FaultLog`: the first fault is logged with its traceback, the next ones are not, since a
fault on every request would flood the program's log with the same traceback.
"""

from __future__ import annotations

import logging

# The logger its records have always had (they were the emitter's own before it held a log).
_logger = logging.getLogger("llm_latency.emitter")


class FaultLog:
    """Logs the first fault inside the plugin of one instrumentation, with its traceback."""

    __slots__ = ("_logged",)

    def __init__(self) -> None:
        self._logged = False

    def failed_once(self, what: str) -> None:
        """Log the exception being handled as a fault in ``what`` (called from an ``except``
        block), unless this instrumentation logged one already."""
        if not self._logged:
            self._logged = True
            _logger.exception("llm-latency: internal error in %s (logged once)", what)
