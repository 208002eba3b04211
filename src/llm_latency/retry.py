"""``llm_latency.retry``: retries with backoff done right, and visible in the trace.

Exponential backoff with full jitter, capped; the server's ``retry-after-ms`` / ``Retry-After``
honoured when the raised error carries the response; only transient failures retried by
default; a deadline; the last exception always re-raised unchanged. The decorated call gets one
logical parent span (named after the function), under which its HTTP attempts and a
``retry.backoff`` span per wait appear.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping
from contextvars import Token
from typing import Any, TypeVar, cast

from opentelemetry.context import Context
from opentelemetry.trace import Span

from llm_latency import emitter as emitting
from llm_latency.calls import LogicalCall, current_call
from llm_latency.headers import retry_after as parse_retry_after

F = TypeVar("F", bound=Callable[..., Any])

#: Status codes retried by default: timeout, conflict, rate limit, server errors.
RETRYABLE_STATUS = frozenset({408, 409, 429})

# Transient errors of the client libraries, by module and class name: checked only for modules
# the program has already imported.
_TRANSIENT_ERRORS: tuple[tuple[str, str], ...] = (
    ("aiohttp", "ClientConnectionError"),
    ("aiohttp", "ServerTimeoutError"),
    ("httpx", "TransportError"),
    ("httpx2", "TransportError"),
    ("requests", "ConnectionError"),
    ("requests", "Timeout"),
    ("urllib3.exceptions", "ProtocolError"),
    ("urllib3.exceptions", "TimeoutError"),
    ("openai", "APIConnectionError"),
    ("anthropic", "APIConnectionError"),
)


def status_of(error: BaseException) -> int | None:
    """The HTTP status of the response an error carries, if any."""
    for holder in (error, getattr(error, "response", None)):
        if holder is None:
            continue
        for name in ("status_code", "status"):
            value = getattr(holder, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def _headers_of(error: BaseException) -> Mapping[str, str] | None:
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None) if response is not None else None
    if headers is None:
        headers = getattr(error, "headers", None)  # aiohttp.ClientResponseError
    return cast("Mapping[str, str] | None", headers)


def retry_after_of(error: BaseException) -> float | None:
    """Seconds the server asked to wait, from the response an error carries, if any."""
    headers = _headers_of(error)
    if not headers:
        return None
    try:
        return parse_retry_after(headers.get("retry-after-ms"), headers.get("retry-after"))
    except Exception:
        return None


def is_transient(error: BaseException) -> bool:
    """The default ``retry_on``: 408, 409, 429 and 5xx responses, connection errors and
    timeouts; nothing else."""
    status = status_of(error)
    if status is not None:
        return status in RETRYABLE_STATUS or 500 <= status <= 599
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    for module_name, class_name in _TRANSIENT_ERRORS:
        module = sys.modules.get(module_name)
        error_class = getattr(module, class_name, None) if module is not None else None
        if isinstance(error_class, type) and isinstance(error, error_class):
            return True
    return False


def reason_of(error: BaseException) -> str:
    """``llm_latency.backoff.reason``: the status code, or else the error type."""
    status = status_of(error)
    return str(status) if status is not None else type(error).__qualname__


def backoff_delay(
    retry_number: int, base_delay: float, max_delay: float, rng: random.Random | None = None
) -> float:
    """Full jitter: uniform in [0, min(max_delay, base_delay * 2**retry_number)]."""
    ceiling = min(max_delay, base_delay * 2.0 ** min(retry_number, 64))
    return (rng or random).uniform(0.0, ceiling)


def _validate(attempts: int, base_delay: float, max_delay: float, deadline: float | None) -> None:
    if attempts < 1:
        raise ValueError("retry: attempts must be at least 1")
    if base_delay < 0 or max_delay < 0:
        raise ValueError("retry: base_delay and max_delay must not be negative")
    if deadline is not None and deadline < 0:
        raise ValueError("retry: deadline must not be negative")


class _Plan:
    """The bookkeeping of one decorated call: attempts, the deadline, the next wait."""

    def __init__(
        self,
        attempts: int,
        base_delay: float,
        max_delay: float,
        deadline: float | None,
        retry_on: Callable[[BaseException], bool],
    ) -> None:
        self.attempts = attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.deadline = deadline
        self.retry_on = retry_on
        self.started = time.monotonic()

    def next_wait(self, attempt: int, error: BaseException) -> tuple[float, float | None] | None:
        """(seconds to wait, the server's retry-after) before the next attempt, or None to
        give up and re-raise."""
        if attempt + 1 >= self.attempts or not self.retry_on(error):
            return None
        asked = retry_after_of(error)
        wait = (
            asked if asked is not None else backoff_delay(attempt, self.base_delay, self.max_delay)
        )
        if self.deadline is not None and time.monotonic() - self.started + wait > self.deadline:
            return None
        if wait > threading.TIMEOUT_MAX:  # a server asking to wait for centuries: give up
            return None
        return wait, asked


class _Run:
    """One decorated call in the trace: its logical span, the attempt number its HTTP attempts
    carry, and a ``retry.backoff`` span around each wait. The tracing is plugin code: a fault
    in it is logged once and the retries go on untraced, as without llm-latency."""

    def __init__(self, name: str, plan: _Plan) -> None:
        self._plan = plan
        self._emitter = emitting.active
        self.call = LogicalCall(own_backoffs=True)
        self._attached: Token[Context] | None = None
        self._exit_call: Callable[[Token[Context] | None], None] | None = None
        self._backoff: Span | None = None
        if self._emitter is not None:
            try:
                calls = self._emitter.calls
                self.call = calls.open_call(name, {}, own_backoffs=True)
                self._attached = calls.enter_call(self.call)
                # Left even after a fault: the call's span stays current until it returns.
                self._exit_call = calls.exit_call
            except Exception:
                self._fault("opening the call")
        self._token = current_call.set(self.call)

    def _fault(self, what: str) -> None:
        emitter, self._emitter = self._emitter, None  # untraced from here on
        if emitter is not None:
            emitter.failed_once(f"llm_latency.retry {what}")
            with contextlib.suppress(Exception):  # the call's span still ends, once
                emitter.calls.abandon_call(self.call)

    def attempt(self, number: int) -> None:
        """Attempt ``number`` (from 0) starts."""
        self.call.number_next(number)

    def failed(self, number: int, error: Exception) -> float | None:
        """Seconds to wait before the next attempt (the backoff span starts), or None to
        give up."""
        wait = self._plan.next_wait(number, error)
        if wait is None:
            return None
        if self._emitter is not None:
            try:
                self._backoff = self._emitter.calls.start_backoff(
                    reason_of(error), wait[1], self.call.last_host
                )
            except Exception:
                self._fault("starting a backoff")
        return wait[0]

    def waited(self, interrupted: BaseException | None = None) -> None:
        """The wait is over (or was cut short by ``interrupted``)."""
        span, self._backoff = self._backoff, None
        if span is None or self._emitter is None:
            return
        try:
            self._emitter.calls.end_backoff(span, interrupted)
        except Exception:
            self._fault("ending a backoff")

    def finish(self, error: BaseException | None = None) -> None:
        """The decorated call returned or raised."""
        current_call.reset(self._token)
        try:
            if self._exit_call is not None:
                self._exit_call(self._attached)
            if self._emitter is not None:
                self._emitter.calls.close_call(self.call, error)
        except Exception:
            self._fault("closing the call")


def _span_name(func: Callable[..., Any]) -> str:
    """``func``'s qualified name as a trace list can show it: ``<locals>`` says nothing there."""
    qualified = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or "retry"
    return str(qualified).replace(".<locals>", "")


def retry(
    attempts: int = 5,
    base_delay: float = 0.5,
    max_delay: float = 30.0,
    deadline: float | None = None,
    retry_on: Callable[[BaseException], bool] | None = None,
    name: str | None = None,
) -> Callable[[F], F]:
    """Retry a sync or async callable on transient failures.

    Args:
        attempts: calls at most, the first included.
        base_delay: seconds; the n-th wait (from 0) is drawn uniformly from
            [0, min(max_delay, base_delay * 2**n)] ("full jitter").
        max_delay: the cap of the drawn wait.
        deadline: seconds from the first attempt; when the next wait would end after it,
            give up at once (re-raising the last error) instead of waiting.
        retry_on: a predicate on the exception; default :func:`is_transient` (408, 409, 429,
            5xx, connection errors and timeouts).
        name: the name of the call's span; default the function's qualified name without
            ``<locals>`` (``Client.complete``, ``main.ask`` for a function defined in
            ``main``).

    A wait the server asks for (``retry-after-ms``, ``Retry-After`` in seconds or as an HTTP
    date, on the response the error carries) replaces the drawn one. The last exception is
    always re-raised unchanged; cancellation during a wait propagates at once.
    """
    _validate(attempts, base_delay, max_delay, deadline)
    if name is not None and not name.strip():
        raise ValueError("retry: name must not be empty")
    predicate = retry_on or is_transient

    def decorate(func: F) -> F:
        span_name = name or _span_name(func)

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                run = _Run(span_name, _Plan(attempts, base_delay, max_delay, deadline, predicate))
                try:
                    for number in range(attempts):
                        run.attempt(number)
                        try:
                            result = await func(*args, **kwargs)
                        except Exception as error:
                            delay = run.failed(number, error)
                            if delay is None:
                                raise
                            try:
                                await asyncio.sleep(delay)
                            except BaseException as stop:
                                run.waited(stop)
                                raise
                            run.waited()
                        else:
                            run.finish()
                            return result
                    raise AssertionError("unreachable: the last attempt returns or raises")
                except BaseException as error:
                    run.finish(error)
                    raise

            return cast("F", run_async)

        @functools.wraps(func)
        def run_sync(*args: Any, **kwargs: Any) -> Any:
            run = _Run(span_name, _Plan(attempts, base_delay, max_delay, deadline, predicate))
            try:
                for number in range(attempts):
                    run.attempt(number)
                    try:
                        result = func(*args, **kwargs)
                    except Exception as error:
                        delay = run.failed(number, error)
                        if delay is None:
                            raise
                        try:
                            time.sleep(delay)
                        except BaseException as stop:
                            run.waited(stop)
                            raise
                        run.waited()
                    else:
                        run.finish()
                        return result
                raise AssertionError("unreachable: the last attempt returns or raises")
            except BaseException as error:
                run.finish(error)
                raise

        return cast("F", run_sync)

    return decorate
