"""The pool-limited burst: one ``aiohttp.ClientSession`` whose connector keeps at most 5
connections per host, 30 requests at once to a slow server, so 25 wait for a connection.
``instrument()`` sets the SDK up from ``OTEL_*``; the program prints one line of its own.

    python tests/programs/pool_burst.py URL [REQUESTS] [LIMIT_PER_HOST]
"""

from __future__ import annotations

import asyncio
import sys

import aiohttp

import llm_latency

BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}


async def burst(url: str, requests: int, limit_per_host: int) -> None:
    connector = aiohttp.TCPConnector(limit_per_host=limit_per_host)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def post() -> None:
            async with session.post(url, json=BODY) as response:
                await response.read()

        await asyncio.gather(*(post() for _ in range(requests)))


def main(url: str, requests: int = 30, limit_per_host: int = 5) -> None:
    llm_latency.instrument()
    asyncio.run(burst(url, requests, limit_per_host))
    print("the program's own output")


if __name__ == "__main__":
    main(sys.argv[1], *(int(arg) for arg in sys.argv[2:]))
