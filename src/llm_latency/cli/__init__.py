"""The ``llm-latency`` command: ``demo``, ``probe``, ``mock-server``.

Needs the ``cli`` extra (``pip install 'llm-latency[cli]'``; from a checkout,
``pip install '.[cli]'``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    """Run the command line; every error is one line on stderr and a non-zero exit."""
    try:
        from llm_latency.cli.commands import run
    except ImportError as exc:
        sys.stderr.write(
            f"llm-latency: error: the command line needs the 'cli' extra "
            f"(pip install 'llm-latency[cli]', or from a checkout pip install '.[cli]'): {exc}\n"
        )
        raise SystemExit(2) from None
    raise SystemExit(run(list(sys.argv[1:] if argv is None else argv)))


__all__ = ["main"]
