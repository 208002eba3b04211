"""httpx and httpx2, sync and async, behind one small async interface for the tests.

Sync clients run in a worker thread, so the loopback servers (on the test's event loop) keep
serving while they block.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx
import httpx2

KINDS = ["httpx-sync", "httpx-async", "httpx2-sync", "httpx2-async"]


@dataclass
class Result:
    status: int
    body: bytes
    lines: list[str]


class Client:
    """One client of ``kind``; ``request`` reads the body in full (or line by line, or only
    ``lines`` lines and then closes the response)."""

    def __init__(self, kind: str, **options: Any) -> None:
        self.kind = kind
        self.module: Any = httpx2 if kind.startswith("httpx2") else httpx
        self.is_async = kind.endswith("async")
        factory = self.module.AsyncClient if self.is_async else self.module.Client
        self._client = factory(**options)

    async def request(
        self, method: str, url: str, *, lines: int | None = None, stream: bool = False,
        **kwargs: Any,
    ) -> Result:  # fmt: skip
        if self.is_async:
            return await self._async_request(method, url, lines, stream, **kwargs)
        return await asyncio.to_thread(self._sync_request, method, url, lines, stream, **kwargs)

    def _sync_request(
        self, method: str, url: str, lines: int | None, stream: bool, **kwargs: Any
    ) -> Result:
        if not stream and lines is None:
            response = self._client.request(method, url, **kwargs)
            return Result(response.status_code, response.content, [])
        with self._client.stream(method, url, **kwargs) as response:
            got: list[str] = []
            for line in response.iter_lines():
                got.append(line)
                if lines is not None and len(got) >= lines:
                    break
            return Result(response.status_code, b"", got)

    async def _async_request(
        self, method: str, url: str, lines: int | None, stream: bool, **kwargs: Any
    ) -> Result:
        if not stream and lines is None:
            response = await self._client.request(method, url, **kwargs)
            return Result(response.status_code, response.content, [])
        async with self._client.stream(method, url, **kwargs) as response:
            got: list[str] = []
            async for line in response.aiter_lines():
                got.append(line)
                if lines is not None and len(got) >= lines:
                    break
            return Result(response.status_code, b"", got)

    async def close(self) -> None:
        if self.is_async:
            await self._client.aclose()
        else:
            await asyncio.to_thread(self._client.close)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
