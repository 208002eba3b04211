"""A real forward proxy on loopback for the tests: Debian's tinyproxy, started with a generated
configuration on a free port (plain HTTP in absolute form, and ``CONNECT`` tunnels).

Also a "hosts file" for names with several addresses: clients resolve through
``socket.getaddrinfo`` (aiohttp's threaded resolver, anyio, httpcore's and urllib3's sync
backends all end there), and a test may give a ``.test`` name the addresses it needs, in order.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The proxy listens on its own loopback address, so that ``network.peer.address`` tells it
#: from the target (the test servers listen on 127.0.0.1).
PROXY_HOST = "127.0.0.2"


@dataclass(frozen=True)
class Proxy:
    """A running tinyproxy; ``url`` carries the credentials when the proxy wants them."""

    port: int
    user: str | None = None
    password: str | None = None
    #: tinyproxy's process (its threads serve the connections).
    pid: int = 0

    @property
    def origin(self) -> str:
        """``http://host:port``: what llm-latency records as the proxy's URL."""
        return f"http://{PROXY_HOST}:{self.port}"

    @property
    def url(self) -> str:
        """The URL a client is given (with ``user:password@`` for a proxy that needs auth)."""
        if self.user is None:
            return self.origin
        return f"http://{self.user}:{self.password}@{PROXY_HOST}:{self.port}"


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _wait_listening(port: int, process: subprocess.Popen[bytes], deadline: float) -> None:
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"tinyproxy exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((PROXY_HOST, port), 0.2):
            return
        time.sleep(0.02)
    raise RuntimeError("tinyproxy did not listen in time")


@contextlib.contextmanager
def tinyproxy(
    *, auth: tuple[str, str] | None = None, connect_ports: tuple[int, ...] = ()
) -> Iterator[Proxy]:
    """Run tinyproxy on ``PROXY_HOST`` and a free port. ``auth``: the (user, password) its
    ``BasicAuth`` wants; ``connect_ports``: the only ports it opens tunnels to (it answers 403
    to a ``CONNECT`` anywhere else), every port when empty. Fails (never skips) when tinyproxy
    is missing: ``.ci/run`` installs it."""
    binary = shutil.which("tinyproxy") or "/usr/bin/tinyproxy"
    if not Path(binary).exists():
        raise RuntimeError("tinyproxy is not installed (apt-get install tinyproxy)")
    port = _free_port(PROXY_HOST)
    lines = [
        f"Port {port}",
        f"Listen {PROXY_HOST}",
        "Timeout 30",
        "MaxClients 64",
        "Allow 127.0.0.0/8",
        "DisableViaHeader Yes",
        "LogLevel Error",
        *(f"ConnectPort {p}" for p in connect_ports),
    ]
    if auth is not None:
        lines.append(f"BasicAuth {auth[0]} {auth[1]}")
    with tempfile.TemporaryDirectory(prefix="llm-latency-proxy-") as folder:
        config = Path(folder) / "tinyproxy.conf"
        config.write_text("\n".join(lines) + "\n")
        process = subprocess.Popen(
            [binary, "-d", "-c", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_listening(port, process, time.monotonic() + 10)
            user, password = auth or (None, None)
            yield Proxy(port, user, password, process.pid)
        finally:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# -- names with several addresses ---------------------------------------------------------------


class Hosts:
    """Names under ``.test`` answered from a table, as a hosts file would (every other name goes
    to the system's resolver)."""

    def __init__(self, original: Any) -> None:
        self._original = original
        self.names: dict[str, list[str]] = {}

    def getaddrinfo(
        self, host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
    ) -> list[Any]:
        name = host.decode() if isinstance(host, bytes) else host
        addresses = self.names.get(name) if isinstance(name, str) else None
        if addresses is None:
            return list(self._original(host, port, family, type, proto, flags))
        found: list[Any] = []
        for address in addresses:
            found.extend(
                self._original(address, port, family, type, proto, flags | socket.AI_NUMERICHOST)
            )
        return found


@contextlib.contextmanager
def blackhole(host: str, port: int) -> Iterator[None]:
    """A listener on ``host``:``port`` whose backlog is full: a connect there is never answered
    (the kernel drops the SYN), so a client waits for its own timeout, as with a dead host."""
    listener = socket.socket()
    filler = socket.socket()
    try:
        listener.bind((host, port))
        listener.listen(0)
        filler.connect((host, port))
        yield
    finally:
        filler.close()
        listener.close()
