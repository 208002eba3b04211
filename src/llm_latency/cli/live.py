"""A probe's requests as they finish: the span collector's listener turns each finished request
span (with its phase children) into a :class:`RequestResult` and hands it to ``emit`` on a
thread of its own, in finish order.

Printing on a thread keeps the terminal out of the measurement: a slow reader of the output
(a pager, a full pipe) blocks that thread, never the event loop or the client threads that the
next requests' phases are timed on.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from types import TracebackType

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from llm_latency import semconv as sc
from llm_latency.cli.results import RequestResult
from llm_latency.diagnosis.records import from_readable_spans, is_attempt, to_attempt

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
            if not is_attempt(record, any(sc.PHASE in c.attributes for c in own)):
                continue
            result = RequestResult.of(to_attempt(record, own), self._origin)
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
