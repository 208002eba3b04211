"""Child processes that do not outlive the test run that started them."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child, before exec (``preexec_fn``): Linux sends it SIGTERM when the test process
    dies, so that no server outlives an interrupted test run."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
