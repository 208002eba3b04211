"""``OTEL_TRACES_EXPORTER=llm_latency_console``: each finished call as a tree, on stderr.

A development exporter: ``OTEL_TRACES_EXPORTER=llm_latency_console python app.py`` (with
``llm_latency.instrument()`` in the program) prints every LLM call the program makes as the
compact tree of :mod:`llm_latency.call_tree` (the call, its attempts with their phases and the
backoffs between them; offsets, durations and request ids). The findings are those of the calls
of a window, each printed once, when it appears, and at exit
(:mod:`llm_latency.console_findings`): what only many calls show (a burst through a small pool)
is found, and a healthy call is followed by nothing. It writes to **stderr**, so that the
program's own output on stdout stays as it was.

The spans of one call reach an exporter in several batches (children end before their parents,
and a batch may end anywhere), so spans are held by trace until the call is known to be over:
its logical parent ended (llm-latency's SDK call span, ``llm_latency.retry``'s span, a GenAI
span or the program's own span), or it has no local parent, or the trace's local root ended.
At most :data:`MAX_BUFFERED_SPANS` are held: past that, the oldest trace is printed as it is.
Whatever is still held is printed at shutdown, then the window's findings.

The lines fit the terminal: ``COLUMNS`` when set, else the width of the terminal the output
goes to; written to a file or a pipe, lines are not broken.
"""

from __future__ import annotations

import logging
import sys
from collections import OrderedDict
from collections.abc import Sequence
from typing import TextIO

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from llm_latency import forks, semconv
from llm_latency.call_tree import calls_with_hint, columns_for
from llm_latency.console_findings import FindingsWindow
from llm_latency.diagnosis.records import (
    Call,
    SpanRecord,
    calls_from_spans,
    from_readable_spans,
    is_backoff,
    is_http_client_span,
    logical_parent_id,
)

_logger = logging.getLogger(__name__)

#: The most spans held across all traces waiting for their calls to end.
MAX_BUFFERED_SPANS = 10_000


class LLMLatencyConsoleSpanExporter(SpanExporter):
    """Prints each finished LLM call as a tree with its findings (see the module docstring).

    ``out``: where to write; default ``sys.stderr`` (looked up at each write).
    """

    def __init__(self, out: TextIO | None = None) -> None:
        self._out = out
        self._lock = forks.lock()
        #: llm-latency's spans held, by trace (oldest trace first) and span id.
        self._traces: OrderedDict[str, dict[str, SpanRecord]] = OrderedDict()
        self._held = 0
        self._closed = False
        self._findings = FindingsWindow()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Hold the spans; print each call whose spans have all arrived."""
        if self._closed:
            return SpanExportResult.FAILURE
        try:
            blocks = self._hold(spans)
        except Exception:  # never break the program over what it prints for development
            _logger.exception("llm-latency: the console exporter could not show these spans")
            return SpanExportResult.FAILURE
        self._write(blocks)
        return SpanExportResult.SUCCESS

    def _hold(self, spans: Sequence[ReadableSpan]) -> list[list[str]]:
        """Hold ``spans``; the reports of the calls now over."""
        blocks: list[list[str]] = []
        with self._lock:
            others: dict[str, list[SpanRecord]] = {}  # other spans: parents, for this batch
            roots: set[str] = set()  # traces whose local root ended
            touched: set[str] = set()
            for span in spans:
                converted = from_readable_spans([span])
                if not converted:
                    continue
                record = converted[0]
                touched.add(record.trace_id)
                if span.parent is None or span.parent.is_remote:
                    roots.add(record.trace_id)
                # An HTTP client instrumentation's span wraps an attempt: it is held too, to
                # find the call's parent above it.
                if record.scope == semconv.SCOPE_NAME or is_http_client_span(record):
                    self._traces.setdefault(record.trace_id, {})[record.span_id] = record
                    self._held += 1
                else:
                    others.setdefault(record.trace_id, []).append(record)
            finished: list[Call] = []
            for trace_id in [t for t in self._traces if t in touched]:
                finished += self._take_finished(
                    trace_id, others.get(trace_id, []), trace_id in roots
                )
            while self._held > MAX_BUFFERED_SPANS and self._traces:
                finished += self._take_finished(next(iter(self._traces)), [], everything=True)
            blocks = self._blocks(finished)
        return blocks

    def _blocks(self, finished: list[Call], at_exit: bool = False) -> list[list[str]]:
        """The tree of each finished call, then the findings that appear with them."""
        width = columns_for(self._out if self._out is not None else sys.stderr)
        blocks = [calls_with_hint([call], width=width) for call in finished]
        findings = self._findings.add(finished, width)
        if at_exit:
            findings += self._findings.at_exit(width)
        return [*blocks, findings] if findings else blocks

    def _take_finished(
        self, trace_id: str, others: list[SpanRecord], everything: bool
    ) -> list[Call]:
        """The calls of ``trace_id`` that are over, their spans forgotten; with ``everything``,
        every call, and the whole trace forgotten."""
        held = self._traces[trace_id]
        records = {**{r.span_id: r for r in others}, **held}
        finished = []
        for call in calls_from_spans(records.values()):
            parent = logical_parent_id(records[call.attempts[0].span_id].parent_id, records)
            if everything or parent is None or parent in records:
                finished.append(call)
        gone = set(held) if everything else _members(finished, records) & set(held)
        for span_id in gone:
            del held[span_id]
        self._held -= len(gone)
        if not held:
            del self._traces[trace_id]
        return finished

    def _write(self, blocks: list[list[str]]) -> None:
        if not blocks:
            return
        out = self._out if self._out is not None else sys.stderr
        text = "".join("\n".join(block) + "\n\n" for block in blocks)
        try:
            out.write(text)
            out.flush()
        except (OSError, ValueError):  # a closed stream at exit: nothing left to tell
            pass

    def shutdown(self) -> None:
        """Print every call still held and the findings of the window at exit, then refuse
        further exports."""
        with self._lock:
            finished: list[Call] = []
            while self._traces:
                finished += self._take_finished(next(iter(self._traces)), [], everything=True)
            try:
                blocks = self._blocks(finished, at_exit=True)
            except Exception:  # never break the program's exit over what it prints
                _logger.exception("llm-latency: the console exporter could not show these spans")
                blocks = []
            self._closed = True
        self._write(blocks)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Nothing to flush: a call is printed as soon as it is over."""
        return True


def _members(calls: Sequence[Call], records: dict[str, SpanRecord]) -> set[str]:
    """The span ids of ``calls``: attempts and their phases, backoffs, the parents, and the
    HTTP client spans between the attempts and their parents."""
    attempts = {attempt.span_id for call in calls for attempt in call.attempts}
    members = set(attempts)
    anchors: set[str] = set()
    for span_id in attempts:
        parent_id = records[span_id].parent_id
        anchor = logical_parent_id(parent_id, records)
        while parent_id is not None and parent_id != anchor:  # the HTTP client spans
            members.add(parent_id)
            parent_id = records[parent_id].parent_id
        if anchor is not None:
            anchors.add(anchor)
    members |= anchors
    for record in records.values():
        is_phase = record.parent_id in attempts
        of_a_call = is_backoff(record) and logical_parent_id(record.parent_id, records) in anchors
        if is_phase or of_a_call:
            members.add(record.span_id)
    return members
