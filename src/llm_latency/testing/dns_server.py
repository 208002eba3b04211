"""A small DNS server on loopback (dnslib), answering after a delay: the demo's "far away"
resolver, and ``probe --dns`` targets in tests."""

from __future__ import annotations

import socket
import time
from typing import Any

from dnslib import QTYPE, RCODE, RR, A
from dnslib.server import BaseResolver, DNSServer


class _Resolver(BaseResolver):  # type: ignore[misc]
    def __init__(self, records: dict[str, str], delay: float) -> None:
        self.records = {
            name.rstrip(".").lower() + ".": address for name, address in records.items()
        }
        self.delay = delay
        self.queries: list[str] = []

    def resolve(self, request: Any, handler: Any) -> Any:
        name = str(request.q.qname).lower()
        self.queries.append(name)
        if self.delay:
            time.sleep(self.delay)
        reply = request.reply()
        address = self.records.get(name)
        if address is None:  # "*.example." matches any name under example.
            labels = name.split(".")
            for i in range(1, len(labels)):
                address = self.records.get("*." + ".".join(labels[i:]))
                if address is not None:
                    break
        if address is None:
            reply.header.rcode = RCODE.NXDOMAIN
        elif request.q.qtype == QTYPE.A:
            reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(address), ttl=60))
        return reply


class _Quiet:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class LocalDNS:
    """A UDP DNS server on 127.0.0.1 that knows ``records`` (name -> IPv4; ``*.zone`` for any
    name under a zone) and answers NXDOMAIN for anything else, ``delay`` seconds after each
    query."""

    def __init__(self, records: dict[str, str], delay: float = 0.0) -> None:
        self.resolver = _Resolver(records, delay)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self._server = DNSServer(
            self.resolver, address="127.0.0.1", port=self.port, logger=_Quiet()
        )
        self._server.start_thread()

    @property
    def nameserver(self) -> str:
        """``127.0.0.1:PORT``, as aiodns (``aiohttp.AsyncResolver``) takes it."""
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop serving."""
        self._server.stop()
