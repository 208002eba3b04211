"""Attempts and backoffs grouped into logical calls: those that share a parent span belong to
one call, the program's own retries included."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from llm_latency import semconv
from llm_latency.diagnosis.model import Attempt, Backoff, Call, SpanRecord
from llm_latency.diagnosis.reading import (
    children_by_parent,
    is_attempt,
    is_backoff,
    to_attempt,
    to_backoff,
)


def calls_from_spans(spans: Iterable[SpanRecord]) -> list[Call]:
    """The logical calls in ``spans``, in start order.

    Attempts and backoffs that share a parent span belong to one call, split where a fresh
    attempt (resend count 0, no backoff before it) begins: a program span that makes three
    different requests holds three calls. A fresh attempt that repeats the request before it
    (:func:`repeats`: the same method and URL, after a refusal or a failure, and a wait) is a
    retry of the program's own loop: it continues the call, the wait an inferred
    :class:`Backoff`. An attempt with no parent in ``spans`` is a call of its own. Spans that
    are not llm-latency's are ignored.
    """
    spans = list(spans)
    by_id = {s.span_id: s for s in spans}
    children = children_by_parent(spans)
    members: list[tuple[int, str | None, Attempt | Backoff]] = []
    for span in spans:
        if is_backoff(span):
            members.append((span.start_ns, span.parent_id, to_backoff(span)))
            continue
        own = children.get(span.span_id, [])
        if is_attempt(span, own):
            members.append((span.start_ns, span.parent_id, to_attempt(span, own)))
    members.sort(key=lambda m: m[0])
    calls: list[Call] = []
    open_by_parent: dict[str, Call] = {}
    for _, direct_parent_id, member in members:
        parent_id = logical_parent_id(direct_parent_id, by_id)
        parent = by_id.get(parent_id) if parent_id is not None else None
        current = open_by_parent.get(parent_id) if parent is not None and parent_id else None
        if isinstance(member, Backoff):
            if current is not None:
                current.backoffs.append(member)
            continue
        if current is not None and _continues(current, member):
            current.attempts.append(member)
            continue
        call = _new_call(member, parent)
        calls.append(call)
        if parent is not None and parent_id:
            open_by_parent[parent_id] = call
    for call in calls:
        _close(call)
    return calls


#: A fresh attempt is a retry of the program's own loop only after a wait of at least this (s):
#: a program that moves on to its next request at once is sending a new one.
OWN_RETRY_MIN_WAIT: Final = 0.005
#: The statuses a retry follows (timeout, conflict, rate limit; and every 5xx).
RETRIED_STATUS: Final = frozenset({408, 409, 429})


def _continues(call: Call, attempt: Attempt) -> bool:
    """Whether ``attempt`` is another attempt of ``call``: a retry the client or the SDK
    counted, one after a ``retry.backoff``, or the program's own (the wait becomes an inferred
    backoff)."""
    last = call.attempts[-1]
    if attempt.resend_count > 0:
        return True
    if call.backoffs and call.backoffs[-1].start_ns >= last.start_ns:
        return True
    wait = repeats(last, attempt)
    if wait is None:
        return False
    reason = str(last.status) if last.error is None else last.error
    ended = last.start_ns + int(last.duration * 1e9)
    call.backoffs.append(Backoff(ended, wait, reason, last.retry_after, inferred=True))
    return True


def repeats(before: Attempt, attempt: Attempt) -> float | None:
    """The wait (s) between ``before`` and ``attempt`` when ``attempt`` is the same request
    again (method and URL) after ``before`` was refused or failed in a way worth a retry (a
    429, 408, 409 or 5xx, or an error), after a wait of :data:`OWN_RETRY_MIN_WAIT` at least;
    None when it is not."""
    if before.succeeded or (before.method, before.url) != (attempt.method, attempt.url):
        return None
    status = before.status
    if (
        before.error is None
        and status is not None
        and not (status in RETRIED_STATUS or status >= 500)
    ):
        return None
    wait = (attempt.start_ns - before.start_ns) / 1e9 - before.duration
    return wait if wait >= OWN_RETRY_MIN_WAIT else None


def logical_parent_id(parent_id: str | None, by_id: Mapping[str, SpanRecord]) -> str | None:
    """The span an attempt or a backoff belongs to, from its parent's id: that parent, or the
    first span above it that is not an HTTP client instrumentation's span for the same request
    (under ``opentelemetry-instrumentation-httpx``, say, llm-latency's request span is a child
    of that instrumentation's CLIENT span; a GenAI span, CLIENT too, is a logical parent)."""
    while parent_id is not None:
        parent = by_id.get(parent_id)
        if parent is None or not is_http_client_span(parent):
            return parent_id
        parent_id = parent.parent_id
    return None


#: Attributes only an HTTP request span carries: the stable HTTP names and the old ones, which
#: the contrib instrumentations still emit by default.
_HTTP_ATTRIBUTES = (semconv.URL_FULL, semconv.HTTP_REQUEST_METHOD, "http.url", "http.method")


def is_http_client_span(span: SpanRecord) -> bool:
    """True for an HTTP client instrumentation's request span (CLIENT, HTTP attributes)."""
    return span.kind == "CLIENT" and any(name in span.attributes for name in _HTTP_ATTRIBUTES)


def _new_call(attempt: Attempt, parent: SpanRecord | None) -> Call:
    name = parent.name if parent is not None else attempt.method or "request"
    sdk = parent.attributes.get(semconv.SDK) if parent is not None else None
    return Call(
        name,
        attempt.start_ns,
        0.0,
        [attempt],
        trace_id=attempt.trace_id,
        sdk=sdk if isinstance(sdk, str) else None,
    )


def _close(call: Call) -> None:
    """The call's bounds: from its first attempt to the end of its last attempt or backoff."""
    ends = [a.start_ns + int(a.duration * 1e9) for a in call.attempts]
    ends += [b.start_ns + int(b.duration * 1e9) for b in call.backoffs]
    call.duration = (max(ends) - call.start_ns) / 1e9
