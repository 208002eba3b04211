"""Real peers on loopback for rehearsing: a mock LLM server with a realistic latency profile
that speaks OpenAI's chat completions, Anthropic's messages and Ollama's native API (each as its
real SDK reads it), and a DNS server that answers as slowly as asked.

The CLI's ``demo`` and ``mock-server``, llm-latency's own tests, and a program's own tests use
them alike. They need the ``cli`` extra (``pip install 'llm-latency[cli]'``, from a checkout
``pip install '.[cli]'``: aiohttp, trustme, dnslib).

.. code-block:: python

    from llm_latency.testing import Profile, running

    async with running(Profile(ttfb=0.2, rate_limit_every=3)) as server:
        ...  # point the client at server.url()
"""

from __future__ import annotations

from llm_latency.testing.dns_server import LocalDNS
from llm_latency.testing.mock_server import (
    HandshakeDelay,
    Profile,
    RunningServer,
    ServerState,
    make_app,
    make_certificates,
    running,
)

__all__ = [
    "HandshakeDelay",
    "LocalDNS",
    "Profile",
    "RunningServer",
    "ServerState",
    "make_app",
    "make_certificates",
    "running",
]
