"""The httpcore adapter, for httpcore (under httpx) and httpcore2 (under httpx2, and so under
openai>=3 and anthropic>=2): one module, two libraries that share the ``trace`` extension.

How each phase is observed (hooks are on classes, so clients and transports created before
``instrument()`` are covered; each group of hooks degrades on its own, see ``_patching``):

- an *attempt* is one call of ``ConnectionPool.handle_request`` /
  ``AsyncConnectionPool.handle_async_request``: the request span starts there,
  ``traceparent`` is added to the request headers, and a ``trace`` callback is put on the
  request (chained to one the program set);
- ``queue``: ``PoolRequest.wait_for_connection`` when the request was not given a connection at
  once (the pool's ``max_connections`` was reached); with HTTP/2, also the wait for the shared
  connection another request opens and for a free stream on it (see ``_http2``);
- ``connect``: the ``connect_tcp`` trace events; ``dns``: the resolver call made inside it
  (see ``_resolver``);
- ``tls``: the ``start_tls`` events;
- through a proxy (``HTTPProxy``, ``AsyncHTTPProxy``), ``dns`` and ``connect`` are the
  proxy's; in a ``CONNECT`` tunnel, ``proxy`` lasts from the tunnel request's send until the
  handshake with the target begins (the ``CONNECT`` exchange is not the attempt's send, wait
  and receive);
- ``send``: ``send_request_headers.started`` to ``send_request_body.complete``;
- ``wait``: from there to ``receive_response_headers.complete``;
- ``receive``: from the headers until the response stream is exhausted or closed. httpcore reads
  the socket only when the program reads the body, so chunk times are the times the program
  received them.

The connection pool (``pools``): a pool is read when the SDK collects, from its first
``create_connection``; an HTTP/1.1 or HTTP/2 connection opens when ``HTTP11Connection`` or
``HTTP2Connection`` is built on its network stream and closes at its ``close``/``aclose``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from typing import Any

from llm_latency.adapters import _http2
from llm_latency.adapters._hooks import SKIP, Hook, phase_hook
from llm_latency.adapters._httpcore_trace import AsyncTrace, SyncTrace, note_peer, program_trace
from llm_latency.adapters._patching import PatchSet, Unavailable
from llm_latency.adapters._resolver import connecting, resolver_hooks
from llm_latency.emitter import Emitter
from llm_latency.headers import CONNECTION_CLOSE, RETRY_COUNT_HEADERS, resend_count
from llm_latency.pools import ConnectionLifetimes, HostPort, PoolMetrics, PoolRow, limit_or_none
from llm_latency.suppression import tracing_allowed
from llm_latency.timeline import QUEUE, Timeline

_RETRY_COUNT_NAMES = frozenset(name.encode() for name in RETRY_COUNT_HEADERS)
_DEFAULT_PORTS = {b"http": 80, b"https": 443, b"ws": 80, b"wss": 443}


def _closed_by(pool: Any, headers: list[tuple[bytes, bytes]]) -> str | None:
    """The setting that closes the attempt's connection after it: a pool that keeps no idle
    connection, or a ``Connection: close`` request header."""
    if getattr(pool, "_max_keepalive_connections", None) == 0:
        return "max_keepalive_connections=0"
    for name, value in headers:
        if name.lower() == b"connection" and value.strip().lower() == b"close":
            return CONNECTION_CLOSE
    return None


def _retry_count(headers: list[tuple[bytes, bytes]]) -> int:
    for name, value in headers:
        if name.lower() in _RETRY_COUNT_NAMES:
            return resend_count(value)
    return 0


# -- response streams --------------------------------------------------------------------------


class _SyncStream:
    """The response body as httpcore gives it, timed chunk by chunk; ends the attempt."""

    def __init__(self, stream: Any, attempt: Timeline, emitter: Emitter) -> None:
        self._stream = stream
        self._attempt = attempt
        self._emitter = emitter

    def __iter__(self) -> Iterator[bytes]:
        attempt, emitter = self._attempt, self._emitter
        try:
            for chunk in self._stream:
                try:
                    attempt.chunk(chunk)
                except Exception:
                    emitter.failed_once("httpcore response chunk")
                yield chunk
        except GeneratorExit:
            raise
        except BaseException as exc:
            emitter.finish_failed(attempt, exc)
            raise
        emitter.finish(attempt)

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            self._emitter.finish(self._attempt)

    def __del__(self) -> None:
        # Dropped unread and unclosed: the attempt ends when the body is collected.
        if not self._attempt.ended:
            self._emitter.finish(self._attempt)


class _AsyncStream:
    """The async twin of :class:`_SyncStream`."""

    def __init__(self, stream: Any, attempt: Timeline, emitter: Emitter) -> None:
        self._stream = stream
        self._attempt = attempt
        self._emitter = emitter

    async def __aiter__(self) -> AsyncIterator[bytes]:
        attempt, emitter = self._attempt, self._emitter
        try:
            async for chunk in self._stream:
                try:
                    attempt.chunk(chunk)
                except Exception:
                    emitter.failed_once("httpcore response chunk")
                yield chunk
        except GeneratorExit:
            raise
        except BaseException as exc:
            emitter.finish_failed(attempt, exc)
            raise
        emitter.finish(attempt)

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            self._emitter.finish(self._attempt)

    def __del__(self) -> None:
        # Dropped unread and unclosed: the attempt ends when the body is collected.
        if not self._attempt.ended:
            self._emitter.finish(self._attempt)


# -- the adapter -------------------------------------------------------------------------------


class HttpcoreAdapter:
    """Hooks one httpcore-like library (``httpcore`` or ``httpcore2``)."""

    def __init__(self, emitter: Emitter, module: str) -> None:
        self.name = module
        self._emitter = emitter
        self._module = module
        self._patches = PatchSet(module, emitter.failed_once)
        self._resolver_acquired = False
        self.lost: list[str] = self._patches.lost

    def install(self) -> None:
        """Hook the connection pools (and their proxy subclasses, which inherit from them).
        Raises :class:`Unavailable` when the request span itself cannot be observed."""
        module = self._module
        p = self._patches
        if not p.group(
            "request spans",
            [
                (
                    f"{module}:ConnectionPool",
                    "handle_request",
                    Hook(self._sync_begins, self._sync_returns, self._fails, self._abandon),
                ),
                (
                    f"{module}:AsyncConnectionPool",
                    "handle_async_request",
                    Hook(self._async_begins, self._async_returns, self._fails, self._abandon),
                ),
            ],
        ):
            raise Unavailable(p.lost)
        queue = phase_hook(QUEUE, _queued_attempt, resume=True)
        p.group(
            "the queue phase",
            [
                (f"{module}._sync.connection_pool:PoolRequest", "wait_for_connection", queue),
                (f"{module}._async.connection_pool:AsyncPoolRequest", "wait_for_connection", queue),
            ],
        )
        self._install_pool_hooks()
        self.lost.extend(resolver_hooks.acquire(self._emitter.failed_once))
        self._resolver_acquired = True

    def _install_pool_hooks(self) -> None:
        module = self._module
        lifetimes = self._emitter.pools.lifetimes
        opened = Hook(partial(_connection_opened, lifetimes))
        closed = Hook(lifetimes.on_close)
        watch = Hook(partial(_watch_pool, self._emitter.pools))
        self._patches.group(
            "the connection pool",
            [
                (f"{module}:ConnectionPool", "create_connection", watch),
                (f"{module}:AsyncConnectionPool", "create_connection", watch),
                (f"{module}._sync.http11:HTTP11Connection", "__init__", opened),
                (f"{module}._sync.http11:HTTP11Connection", "close", closed),
                (f"{module}._async.http11:AsyncHTTP11Connection", "__init__", opened),
                (f"{module}._async.http11:AsyncHTTP11Connection", "aclose", closed),
            ],
        )
        _http2.install(self._patches, module, lifetimes, partial(_connection_opened, lifetimes))

    def uninstall(self) -> None:
        """Undo every hook. Responses in flight still end when they are closed."""
        self._patches.restore()
        if self._resolver_acquired:
            self._resolver_acquired = False
            resolver_hooks.release()

    def _begin(self, pool: Any, request: Any, trace_factory: Callable[..., Any]) -> Any:
        """Start the attempt for an httpcore request, or SKIP if it must not be traced."""
        if not tracing_allowed():
            return SKIP
        url = request.url
        scheme = url.scheme
        host = url.host.decode("ascii", "replace")
        port = url.port
        netloc = f"[{host}]" if ":" in host else host
        if port is not None:
            netloc = f"{netloc}:{port}"
        target = url.target.decode("ascii", "replace")
        attempt = Timeline(
            request.method.decode("ascii", "replace"),
            f"{scheme.decode('ascii', 'replace')}://{netloc}{target}",
        )
        attempt.resend_count = _retry_count(request.headers)
        attempt.closed_by = _closed_by(pool, request.headers)
        proxy = getattr(pool, "_proxy_url", None)
        if proxy is not None:
            attempt.proxy_url = _origin_url(proxy)
        attempt.client = "httpx2" if self._module == "httpcore2" else "httpx"
        carrier: dict[str, str] = {}
        self._emitter.start(
            attempt,
            host,
            port if port is not None else _DEFAULT_PORTS.get(scheme),
            target.partition("?")[0],
            carrier,
            on_loop=trace_factory is AsyncTrace,
        )
        try:
            for name, value in carrier.items():
                request.headers.append((name.encode("ascii"), value.encode("ascii")))
            extensions = dict(request.extensions)
            extensions["trace"] = trace_factory(attempt, program_trace(extensions), self._emitter)
            request.extensions = extensions
        except BaseException:
            self._emitter.finish(attempt)
            raise
        return attempt, connecting.set(None), _http2.current_attempt.set(attempt)

    def _sync_begins(self, pool: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._begin(pool, args[0] if args else kwargs["request"], SyncTrace)

    def _async_begins(self, pool: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._begin(pool, args[0] if args else kwargs["request"], AsyncTrace)

    def _sync_returns(self, state: tuple[Timeline, Any, Any], response: Any) -> Any:
        attempt, token, sending = state
        connecting.reset(token)
        if attempt.peer_address is None:  # a pooled connection
            note_peer(attempt, response.extensions.get("network_stream"))
        _http2.current_attempt.reset(sending)
        response.stream = _SyncStream(response.stream, attempt, self._emitter)
        return response

    def _async_returns(self, state: tuple[Timeline, Any, Any], response: Any) -> Any:
        attempt, token, sending = state
        connecting.reset(token)
        if attempt.peer_address is None:  # a pooled connection
            note_peer(attempt, response.extensions.get("network_stream"))
        _http2.current_attempt.reset(sending)
        response.stream = _AsyncStream(response.stream, attempt, self._emitter)
        return response

    def _fails(self, state: tuple[Timeline, Any, Any], exc: BaseException) -> None:
        attempt, token, sending = state
        connecting.reset(token)
        _http2.current_attempt.reset(sending)
        self._emitter.finish_failed(attempt, exc)

    def _abandon(self, state: tuple[Timeline, Any, Any]) -> None:
        self._emitter.finish(state[0])


def _origin_url(url: Any) -> str:
    """``scheme://host:port`` of an httpcore ``URL`` (a proxy's)."""
    scheme, host = url.scheme.decode("ascii", "replace"), url.host.decode("ascii", "replace")
    netloc = f"[{host}]" if ":" in host else host
    return f"{scheme}://{netloc}" + ("" if url.port is None else f":{url.port}")


def _queued_attempt(
    pool_request: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Timeline | None:
    """The attempt of a request that has no connection yet (it will wait for one; a request
    may wait more than once, and the phase spans all)."""
    if pool_request.connection is not None:
        return None
    trace = pool_request.request.extensions.get("trace")
    return trace.attempt if isinstance(trace, SyncTrace) else None


# -- the connection pool ---------------------------------------------------------------------


def _watch_pool(
    pools: PoolMetrics, pool: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    pools.watch(pool, _read_pool)
    return SKIP


def _connection_opened(
    lifetimes: ConnectionLifetimes, connection: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """An HTTP/1.1 connection is built on a network stream that is up (TCP, TLS)."""
    origin = args[0] if args else kwargs["origin"]
    lifetimes.opened(connection, origin.host.decode("ascii", "replace"), origin.port)
    return SKIP


def _read_pool(pool: Any, lifetimes: ConnectionLifetimes) -> Iterator[PoolRow]:
    """One pool's connections per host. Each pooled ``HTTPConnection`` wraps the HTTP/1.1 or
    HTTP/2 connection once it is established (``_connection``); ``max_connections`` bounds the
    whole pool, so it is each host's limit."""
    limit = limit_or_none(pool._max_connections)
    rows: dict[HostPort, list[int]] = {}
    for connection in list(pool._connections):
        established = getattr(connection, "_connection", None)
        host = None if established is None else lifetimes.host_of(established)
        if host is None or connection.is_closed():
            continue
        rows.setdefault(host, [0, 0])[1 if connection.is_idle() else 0] += 1
    for host, (active, idle) in rows.items():
        yield host, active, idle, limit
