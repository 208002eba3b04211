"""Misbehaving HTTP peers on loopback: raw sockets that answer every request with crafted bytes.

Each server listens on 127.0.0.1, port 0, and serves each connection in a daemon thread, so it
works for sync clients (in worker threads) and async clients (on the test's event loop) alike.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from types import TracebackType
from typing import Self

#: The end of a request's header block.
_END_OF_HEADERS = b"\r\n\r\n"


def _read_request(conn: socket.socket, limit: int = 1 << 20) -> bytes:
    """Read one request head, and a body announced by Content-Length (tests send small ones)."""
    data = b""
    while _END_OF_HEADERS not in data and len(data) < limit:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(_END_OF_HEADERS)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            with contextlib.suppress(ValueError):
                length = int(value.strip())
    while len(body) < min(length, limit):
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return data


class _Listener:
    """A TCP listener on 127.0.0.1 (port 0) that hands each connection to ``_accepted`` from
    a daemon thread, and closes everything on ``close()`` (or leaving a ``with`` block)."""

    def __init__(self, name: str) -> None:
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name=name, daemon=True).start()

    def _accepted(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self._listener.accept()
                with self._lock:
                    if self._closed:
                        conn.close()
                        return
                    self._conns.append(conn)
                self._accepted(conn)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, []
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept
        with contextlib.suppress(OSError):
            self._listener.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv
            with contextlib.suppress(OSError):
                conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class RawServer(_Listener):
    """Answers each request with ``response`` (bytes, sent as they are), then closes.

    The close is graceful: the server reads the whole request first, half-closes (FIN after
    the crafted bytes), then waits for the client to close, so what the client reads never
    depends on a reset racing the data. ``response=b""`` is a peer that reads the request and
    closes without sending a byte. ``response`` may be changed between requests.
    """

    def __init__(self, response: bytes = b"", *, linger: float = 2.0) -> None:
        self.response = response
        self.linger = linger
        self.requests: list[bytes] = []
        super().__init__("raw-server")

    def url(self, path: str = "/v1/chat/completions", scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def _accepted(self, conn: socket.socket) -> None:
        threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.settimeout(5.0)
            request = _read_request(conn)
            self.requests.append(request)
            if self.response:
                conn.sendall(self.response)
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(self.linger)
            while conn.recv(65536):  # until the client closes (or the linger runs out)
                pass
        with contextlib.suppress(OSError):
            conn.close()


def response(
    status_line: bytes = b"HTTP/1.1 200 OK",
    headers: list[bytes] | None = None,
    body: bytes = b"",
    *,
    content_length: bool = True,
) -> bytes:
    """A response, possibly malformed: the status line and header lines are sent verbatim."""
    lines = [status_line, *(headers or [])]
    if content_length:
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


class BlackHole(_Listener):
    """Accepts connections and never answers: a collector that hangs, a TLS server that never
    says hello. With ``read=False`` it does not even read, so a large request body stalls.

    ``connections`` and ``received`` say whether anyone tried to talk to it.
    """

    def __init__(self, *, read: bool = True) -> None:
        self.read = read
        self.connections = 0
        self.received = 0
        super().__init__("black-hole")

    def _accepted(self, conn: socket.socket) -> None:
        with self._lock:
            self.connections += 1
        if self.read:
            threading.Thread(target=self._swallow, args=(conn,), daemon=True).start()

    def _swallow(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := conn.recv(65536):
                with self._lock:
                    self.received += len(data)


class PacedStream(_Listener):
    """Streams an OpenAI-style chat completion at a pace of its own, each request in a thread
    of its own (so a program that blocks its event loop does not delay it): the headers after
    ``headers_after`` s, the first event ``first_event_after`` s later, then ``events`` content
    events ``interval`` s apart and ``data: [DONE]``, in HTTP/1.1 chunks. ``late``: the longest
    time (s) a content event went out after its pace said (the server's own pause beyond
    ``interval``: its thread kept from a CPU or from the GIL), over every stream served."""

    def __init__(
        self,
        *,
        events: int = 20,
        interval: float = 0.02,
        headers_after: float = 0.0,
        first_event_after: float = 0.0,
    ) -> None:
        self.events = events
        self.interval = interval
        self.headers_after = headers_after
        self.first_event_after = first_event_after
        self.late = 0.0
        super().__init__("paced-stream")

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"

    def _accepted(self, conn: socket.socket) -> None:
        threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _read_request(conn)
            time.sleep(self.headers_after)
            head = (
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            )
            conn.sendall(head)
            time.sleep(self.first_event_after)
            sent = 0.0
            for i in range(self.events):
                if i:
                    time.sleep(self.interval)
                event = b'data: {"choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n'
                conn.sendall(b"%x\r\n%s\r\n" % (len(event), event))
                now = time.perf_counter()
                if i:
                    with self._lock:
                        self.late = max(self.late, now - sent - self.interval)
                sent = now
            done = b"data: [DONE]\n\n"
            conn.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
