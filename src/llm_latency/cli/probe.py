"""``llm-latency probe``: httpstat for LLM endpoints.

It sends requests with the chosen client, instrumented by llm-latency itself, and reports each
request's phases from the spans it collected, each request as it finishes: the span collector's
listener turns each finished request span (with its phase children) into a RequestResult and
hands it to ``emit`` on a thread of its own, in finish order. Printing on a thread keeps the
terminal out of the measurement: a slow reader of the output (a pager, a full pipe) blocks that
thread, never the event loop or the client threads that the next requests' phases are timed on.

The clients' ways to send, and the deadline of each request, are in ``probe_clients``.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from llm_latency.cli.errors import describe
from llm_latency.cli.probe_clients import CLIENTS, ProbeOptions
from llm_latency.cli.probe_input import ProbeRequest
from llm_latency.cli.results import RequestResult, SpanCollector, result_of
from llm_latency.diagnosis.records import from_readable_spans


@dataclass
class UrlRun:
    """One URL's run: the requests in the order they finished, the errors raised, every span
    collected, and why the run stopped early (``interrupted``, ``broken pipe``) if it did."""

    results: list[RequestResult]
    errors: list[BaseException]
    spans: list[ReadableSpan] = field(default_factory=list)
    stopped: str | None = None


Emit = Callable[[RequestResult], None]
_Item = tuple[ReadableSpan, list[ReadableSpan], "int | None"]


class Finished:
    """Collects a run's results as their spans end, and emits each on a printer thread.

    ``origin_ns`` (epoch ns) is the run's start, which ``RequestResult.start`` counts from.
    When ``emit`` raises ``BrokenPipeError`` (the reader of the output went away), nothing more
    is emitted, :attr:`broken` is set and ``on_broken`` is called (from the printer thread).
    """

    def __init__(self, origin_ns: int, emit: Emit | None, on_broken: Callable[[], None]) -> None:
        self.results: list[RequestResult] = []
        self.broken = False
        self._origin = origin_ns
        self._emit = emit
        self._on_broken = on_broken
        self._children: dict[int, list[ReadableSpan]] = {}
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="llm-latency-printer", daemon=True)

    def __enter__(self) -> Finished:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def on_span(self, span: ReadableSpan, number: int | None) -> None:
        """The collector's listener: a span ended (phase spans end before their request's)."""
        context = span.context
        if context is None:
            return
        with self._lock:
            if span.parent is not None:
                self._children.setdefault(span.parent.span_id, []).append(span)
            if span.kind is not SpanKind.CLIENT:
                return
            children = self._children.pop(context.span_id, [])
        self._queue.put((span, children, number))

    def close(self) -> None:
        """Emit what is queued, stop the thread; re-raise what ``emit`` raised (but a broken
        pipe, reported by :attr:`broken`)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if self._failure is not None:
            raise self._failure

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            span, children, number = item
            record, *own = from_readable_spans([span, *children])
            result = result_of(record, own, self._origin)
            if result is None:
                continue
            result.number = number
            self.results.append(result)
            if self._emit is None or self.broken or self._failure is not None:
                continue
            try:
                self._emit(result)
            except BrokenPipeError:
                self.broken = True
                self._on_broken()
            except BaseException as exc:  # re-raised by close(), on the main thread
                self._failure = exc


class _Stop:
    """Stops a run early: on SIGINT (Ctrl-C; a second one aborts at once), or when the output
    is gone. The spans that end afterwards are dropped: they did not finish."""

    def __init__(self, collector: SpanCollector) -> None:
        self.reason: str | None = None
        self._collector = collector
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()

    def now(self, reason: str) -> None:
        """Stop the run (on the loop's thread)."""
        if self.reason is not None:
            if reason == "interrupted":
                raise KeyboardInterrupt
            return
        self.reason = reason
        self._collector.freeze()
        if self._task is not None:
            self._task.cancel()

    def soon(self, reason: str) -> None:
        """Stop the run, from any thread."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: the run is over
            self._loop.call_soon_threadsafe(self.now, reason)


async def probe_url(
    url: str,
    request: ProbeRequest,
    client: str,
    options: ProbeOptions,
    collector: SpanCollector,
    emit: Emit | None = None,
) -> UrlRun:
    """Send ``options.n`` requests to ``url``; ``emit`` each result as it finishes (on a
    printer thread). SIGINT stops the run: the requests that finished are returned."""
    loop = asyncio.get_running_loop()
    stop = _Stop(collector)
    errors: list[BaseException] = []
    collector.take()
    with Finished(time.time_ns(), emit, lambda: stop.soon("broken pipe")) as finished:
        collector.listener = finished.on_span
        handled = False
        # SIGINT ignored (a run under nohup, in a shell's background) stays ignored; and the
        # loop's removal of its handler puts back Python's default, not the one there before.
        previous = signal.getsignal(signal.SIGINT)
        if previous is not signal.SIG_IGN:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signal.SIGINT, stop.now, "interrupted")
                handled = True
        try:
            await CLIENTS[client](url, request, options, errors)
            await asyncio.sleep(0)  # let callbacks that end the last spans run
        except asyncio.CancelledError:
            if stop.reason is None:
                raise
        finally:
            if handled:
                loop.remove_signal_handler(signal.SIGINT)
                if previous is not None and signal.getsignal(signal.SIGINT) is not previous:
                    signal.signal(signal.SIGINT, previous)
            collector.listener = None
    return UrlRun(finished.results, errors, collector.take(), stop.reason)


def error_lines(url: str, errors: list[BaseException], timeout: float) -> list[str]:
    """One line per distinct error, most frequent first."""
    counts: dict[str, int] = {}
    for error in errors:
        line = describe(error, url, timeout)
        counts[line] = counts.get(line, 0) + 1
    return [
        f"{line}" + (f" ({count} requests)" if count > 1 else "")
        for line, count in sorted(counts.items(), key=lambda kv: -kv[1])
    ]
