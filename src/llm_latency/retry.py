"""``llm_latency.retry``: retries with backoff done right, and visible in the trace.

Exponential backoff with full jitter, capped; the server's ``retry-after-ms`` / ``Retry-After``
honoured when the raised error carries the response; only transient failures retried by
default; a deadline; the last exception always re-raised unchanged. The decorated call gets one
logical parent span (named after the function), under which its HTTP attempts and a
``retry.backoff`` span per wait appear.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import random
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from opentelemetry import context, trace
from opentelemetry.trace import Span, Status, StatusCode

from llm_latency import headers as hdr
from llm_latency.calls import LogicalCall, current_call

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
        return hdr.retry_after(headers.get("retry-after-ms"), headers.get("retry-after"))
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
        return wait, asked


def _emitter() -> Any:
    from llm_latency.instrumentor import LLMLatencyInstrumentor

    return LLMLatencyInstrumentor().emitter


def _start_call(name: str) -> tuple[LogicalCall, Span | None, Any, Any]:
    emitter = _emitter()
    call = emitter.open_call(name, {}) if emitter is not None else LogicalCall()
    call.own_backoffs = True
    span: Span | None = call.span
    token = current_call.set(call)
    attached = context.attach(trace.set_span_in_context(span)) if span is not None else None
    return call, span, token, attached


def _end_call(
    entered: tuple[LogicalCall, Span | None, Any, Any], error: BaseException | None
) -> None:
    call, _, token, attached = entered
    if attached is not None:
        context.detach(attached)
    current_call.reset(token)
    emitter = _emitter()
    if emitter is not None:
        emitter.close_call(call, error)


def _start_backoff(call: LogicalCall, error: BaseException, asked: float | None) -> Span | None:
    emitter = _emitter()
    if emitter is None:
        return None
    return cast("Span", emitter.start_backoff(reason_of(error), asked, call.last_host))


def _end_backoff(span: Span | None, error: BaseException | None = None) -> None:
    if span is None:
        return
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, type(error).__qualname__))
        span.record_exception(error)
    span.end()


def retry(
    attempts: int = 5,
    base_delay: float = 0.5,
    max_delay: float = 30.0,
    deadline: float | None = None,
    retry_on: Callable[[BaseException], bool] | None = None,
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

    A wait the server asks for (``retry-after-ms``, ``Retry-After`` in seconds or as an HTTP
    date, on the response the error carries) replaces the drawn one. The last exception is
    always re-raised unchanged; cancellation during a wait propagates at once.
    """
    _validate(attempts, base_delay, max_delay, deadline)
    predicate = retry_on or is_transient

    def decorate(func: F) -> F:
        name = getattr(func, "__qualname__", getattr(func, "__name__", "retry"))

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                plan = _Plan(attempts, base_delay, max_delay, deadline, predicate)
                entered = _start_call(name)
                try:
                    for attempt in range(attempts):
                        entered[0].helper_attempt = attempt
                        try:
                            result = await func(*args, **kwargs)
                        except Exception as error:
                            wait = plan.next_wait(attempt, error)
                            if wait is None:
                                raise
                            backoff = _start_backoff(entered[0], error, wait[1])
                            try:
                                await asyncio.sleep(wait[0])
                            except BaseException as stop:
                                _end_backoff(backoff, stop)
                                raise
                            _end_backoff(backoff)
                        else:
                            _end_call(entered, None)
                            return result
                    raise AssertionError("unreachable")  # pragma: no cover
                except BaseException as error:
                    _end_call(entered, error)
                    raise

            return cast("F", run_async)

        @functools.wraps(func)
        def run_sync(*args: Any, **kwargs: Any) -> Any:
            plan = _Plan(attempts, base_delay, max_delay, deadline, predicate)
            entered = _start_call(name)
            try:
                for attempt in range(attempts):
                    entered[0].helper_attempt = attempt
                    try:
                        result = func(*args, **kwargs)
                    except Exception as error:
                        wait = plan.next_wait(attempt, error)
                        if wait is None:
                            raise
                        backoff = _start_backoff(entered[0], error, wait[1])
                        try:
                            time.sleep(wait[0])
                        except BaseException as stop:
                            _end_backoff(backoff, stop)
                            raise
                        _end_backoff(backoff)
                    else:
                        _end_call(entered, None)
                        return result
                raise AssertionError("unreachable")  # pragma: no cover
            except BaseException as error:
                _end_call(entered, error)
                raise

        return cast("F", run_sync)

    return decorate
