"""Advice that names the setting of the client in use: the attempts carry the client library
that made them (``llm_latency.client``), so a fix can name the knob the program can turn."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from llm_latency.diagnosis.measured import clients
from llm_latency.diagnosis.records import Attempt

#: Per client library, the setting that bounds its connection pool.
POOL_KNOBS: Final = {
    "aiohttp": "aiohttp: TCPConnector(limit=..., limit_per_host=...)",
    "httpx": "httpx: Limits(max_connections=...)",
    "httpx2": "httpx2: Limits(max_connections=...)",
    "urllib3": "requests: HTTPAdapter(pool_maxsize=..., pool_block=True) mounted on the "
    "Session; urllib3: PoolManager(maxsize=...)",
}


def pool_knob(attempts: Iterable[Attempt]) -> str:
    """The pool setting of the clients the attempts came from; every client's when the spans
    do not say which."""
    used = sorted(clients(attempts) & POOL_KNOBS.keys())
    return "; ".join(POOL_KNOBS[name] for name in (used or POOL_KNOBS))
