"""Finished calls as plain records: what the diagnosis, the CLI and ``explain`` read.

Spans come in three shapes: the SDK's ``ReadableSpan`` (the CLI and the development exporter),
Jaeger's JSON and OTLP JSON (``explain``). Each is first turned into a :class:`SpanRecord`, then
:func:`calls_from_spans` reads llm-latency's span model back: request spans (one per attempt)
with their phase children, ``retry.backoff`` spans, and the logical parent that groups them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llm_latency import semconv
from llm_latency.providers import REQUEST_ID_HEADERS
from llm_latency.timeline import PHASE_NAMES

#: Rate-limit response headers shown with each attempt, in this order.
RATELIMIT_HEADERS = (
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-requests",
    "retry-after-ms",
)


def is_success(status: int | None, error: str | None) -> bool:
    """What "succeeded" means for an attempt everywhere: a response with a status below 400,
    and no error (none before it, and none after the headers, such as a stream cut short)."""
    return error is None and status is not None and status < 400


@dataclass(frozen=True)
class SpanRecord:
    """One span, whatever it was read from. Ids are lowercase hex strings."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    kind: str  # "CLIENT", "INTERNAL", "SERVER", ...
    start_ns: int  # since the epoch
    end_ns: int
    attributes: Mapping[str, Any]
    scope: str | None = None  # the instrumentation scope's name, when known


#: The phases that set a connection up: what a pooled connection saves (``proxy``: reaching a
#: proxy and opening its tunnel, when the adapter shows it as a phase of its own).
SETUP_PHASES = ("dns", "proxy", "connect", "tls")


@dataclass(frozen=True)
class Phase:
    """One phase of an attempt: offset from the attempt's start and duration, in seconds;
    ``lag``: how much of it was the program's own event-loop stall (None when not measured:
    sync clients, or spans from before the measurement existed)."""

    name: str
    start: float
    duration: float
    lag: float | None = None

    @property
    def net(self) -> float:
        """The phase's duration without the program's own stall: what the network, the peer
        or the pool took (s)."""
        return max(self.duration - (self.lag or 0.0), 0.0)


@dataclass
class Attempt:
    """One HTTP attempt (one request span)."""

    start_ns: int
    duration: float
    phases: tuple[Phase, ...]
    url: str = ""
    host: str = ""
    method: str = ""
    status: int | None = None
    error: str | None = None  # error.type, unless it is just the status code
    failed_phase: str | None = None
    reused: bool | None = None
    request_id: str | None = None
    server_processing: float | None = None
    network_overhead: float | None = None
    event_loop_lag: float | None = None
    protocol: str | None = None  # network.protocol.version: "1.1", "2"
    time_to_first_chunk: float | None = None
    client: str | None = None  # the client library (llm_latency.client), when known
    stream_events: int | None = None
    stream_max_gap: float | None = None
    stream_mean_interval: float | None = None
    stream_chunk_rate: float | None = None
    resend_count: int = 0
    ratelimit: dict[str, str] = field(default_factory=dict)
    trace_id: str = ""
    span_id: str = ""
    #: The endpoint and kind (edge, inference) of a ``llm-latency watch`` probe's attempt.
    probe: str | None = None
    probe_kind: str | None = None
    #: The answer's tokens as the server counted them, and what they tell of its time.
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    time_to_first_token: float | None = None
    time_per_output_token: float | None = None
    server_time_per_output_token_max: float | None = None
    #: The server's own split of its time, where the provider says it (s).
    server_queue: float | None = None
    server_prefill: float | None = None
    server_decode: float | None = None

    def phase(self, name: str) -> float | None:
        """The duration of phase ``name`` (s), or None when it did not happen."""
        for each in self.phases:
            if each.name == name:
                return each.duration
        return None

    def net(self, name: str) -> float | None:
        """Phase ``name``'s duration without the program's own loop stall (s), or None when
        it did not happen: what a network rule may look at."""
        for each in self.phases:
            if each.name == name:
                return each.net
        return None

    @property
    def connection_setup(self) -> float:
        """DNS + proxy + TCP + TLS (s), the program's own stall taken off: what a pooled
        connection would have saved."""
        return sum(p.net for p in self.phases if p.name in SETUP_PHASES)

    @property
    def opened_connection(self) -> bool:
        """True when the attempt connected (it has a connect phase, or was not reused)."""
        return self.reused is False or self.phase("connect") is not None

    @property
    def streamed(self) -> bool:
        """True for a streamed response (its first chunk time or event count is known)."""
        return self.time_to_first_chunk is not None or bool(self.stream_events)

    @property
    def first_byte(self) -> float | None:
        """Seconds from the attempt's start to the end of the wait: the first response byte."""
        for each in self.phases:
            if each.name == "wait":
                return each.start + each.duration
        return None

    @property
    def succeeded(self) -> bool:
        """A whole response with a status below 400 (:func:`is_success`)."""
        return is_success(self.status, self.error)


@dataclass(frozen=True)
class Backoff:
    """A ``retry.backoff`` span: the wait between two attempts of one call."""

    start_ns: int
    duration: float
    reason: str | None = None
    retry_after: float | None = None


@dataclass
class Call:
    """One logical call: its attempts and the backoffs between them, in start order."""

    name: str
    start_ns: int
    duration: float
    attempts: list[Attempt]
    backoffs: list[Backoff] = field(default_factory=list)
    trace_id: str = ""

    @property
    def backoff_time(self) -> float:
        """Seconds spent waiting between attempts."""
        return sum(b.duration for b in self.backoffs)


def _first(value: Any) -> str | None:
    if isinstance(value, (tuple, list)):
        return str(value[0]) if value else None
    return None if value is None else str(value)


def _float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _int(value: Any) -> int | None:
    number = _float(value)
    return None if number is None else int(number)


def _bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


def _header(attributes: Mapping[str, Any], name: str) -> str | None:
    return _first(attributes.get(f"http.response.header.{name}"))


def children_by_parent(spans: Iterable[SpanRecord]) -> dict[str, list[SpanRecord]]:
    """Each span's children, by the parent's id."""
    children: dict[str, list[SpanRecord]] = {}
    for span in spans:
        if span.parent_id is not None:
            children.setdefault(span.parent_id, []).append(span)
    return children


def is_attempt(span: SpanRecord, children: Sequence[SpanRecord]) -> bool:
    """True for llm-latency's request span: a span of its scope with ``url.full`` (CLIENT, or
    INTERNAL under another instrumentation's CLIENT span for the same request). When the scope
    is not known, a span with ``url.full`` and phase ``children`` or llm-latency's attributes."""
    if semconv.URL_FULL not in span.attributes:
        return False
    if span.scope is not None:
        return span.scope == semconv.SCOPE_NAME
    return any(semconv.PHASE in child.attributes for child in children) or any(
        key.startswith("llm_latency.") for key in span.attributes
    )


def is_backoff(span: SpanRecord) -> bool:
    """True for a ``retry.backoff`` span."""
    return span.name == semconv.BACKOFF_SPAN and span.kind == "INTERNAL"


def to_attempt(span: SpanRecord, children: Sequence[SpanRecord]) -> Attempt:
    """The attempt a request span and its phase children describe."""
    attributes = span.attributes
    phases = []
    for child in children:
        name = str(child.attributes.get(semconv.PHASE, ""))
        if name in PHASE_NAMES:
            phases.append(
                Phase(
                    name,
                    (child.start_ns - span.start_ns) / 1e9,
                    (child.end_ns - child.start_ns) / 1e9,
                    _float(child.attributes.get(semconv.EVENT_LOOP_LAG)),
                )
            )
    phases.sort(key=lambda p: PHASE_NAMES.index(p.name))
    status = _int(attributes.get(semconv.HTTP_RESPONSE_STATUS_CODE))
    error = attributes.get(semconv.ERROR_TYPE)
    ratelimit = {
        name: value
        for name in RATELIMIT_HEADERS
        if (value := _header(attributes, name)) is not None
    }
    return Attempt(
        start_ns=span.start_ns,
        duration=(span.end_ns - span.start_ns) / 1e9,
        phases=tuple(phases),
        url=str(attributes.get(semconv.URL_FULL, "")),
        host=str(attributes.get(semconv.SERVER_ADDRESS, "")),
        method=str(attributes.get(semconv.HTTP_REQUEST_METHOD, "")),
        status=status,
        error=None if error is None or str(error) == str(status) else str(error),
        failed_phase=_first(attributes.get(semconv.FAILED_PHASE)),
        reused=_bool(attributes.get(semconv.CONNECTION_REUSED)),
        request_id=next(
            (rid for name in REQUEST_ID_HEADERS if (rid := _header(attributes, name))), None
        ),
        server_processing=_float(attributes.get(semconv.SERVER_PROCESSING_TIME)),
        network_overhead=_float(attributes.get(semconv.NETWORK_OVERHEAD)),
        event_loop_lag=_float(attributes.get(semconv.EVENT_LOOP_LAG)),
        protocol=_first(attributes.get(semconv.NETWORK_PROTOCOL_VERSION)),
        time_to_first_chunk=_float(attributes.get(semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK)),
        client=_first(attributes.get(semconv.CLIENT)),
        stream_events=_int(attributes.get(semconv.STREAM_EVENTS)),
        stream_max_gap=_float(attributes.get(semconv.STREAM_MAX_GAP)),
        stream_mean_interval=_float(attributes.get(semconv.STREAM_MEAN_INTERVAL)),
        stream_chunk_rate=_float(attributes.get(semconv.STREAM_CHUNK_RATE)),
        resend_count=_int(attributes.get(semconv.HTTP_REQUEST_RESEND_COUNT)) or 0,
        ratelimit=ratelimit,
        trace_id=span.trace_id,
        span_id=span.span_id,
        probe=_first(attributes.get(semconv.PROBE_ENDPOINT)),
        probe_kind=_first(attributes.get(semconv.PROBE_KIND)),
        model=_first(attributes.get(semconv.GEN_AI_RESPONSE_MODEL)),
        input_tokens=_int(attributes.get(semconv.GEN_AI_USAGE_INPUT_TOKENS)),
        output_tokens=_int(attributes.get(semconv.GEN_AI_USAGE_OUTPUT_TOKENS)),
        cached_tokens=_int(attributes.get(semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS)),
        time_to_first_token=_float(attributes.get(semconv.TIME_TO_FIRST_TOKEN)),
        time_per_output_token=_float(attributes.get(semconv.TIME_PER_OUTPUT_TOKEN)),
        server_time_per_output_token_max=_float(
            attributes.get(semconv.SERVER_TIME_PER_OUTPUT_TOKEN_MAX)
        ),
        server_queue=_float(attributes.get(semconv.SERVER_QUEUE_TIME)),
        server_prefill=_float(attributes.get(semconv.SERVER_PREFILL_TIME)),
        server_decode=_float(attributes.get(semconv.SERVER_DECODE_TIME)),
    )


def to_backoff(span: SpanRecord) -> Backoff:
    """The backoff a ``retry.backoff`` span describes."""
    reason = span.attributes.get(semconv.BACKOFF_REASON)
    return Backoff(
        start_ns=span.start_ns,
        duration=(span.end_ns - span.start_ns) / 1e9,
        reason=None if reason is None else str(reason),
        retry_after=_float(span.attributes.get(semconv.BACKOFF_RETRY_AFTER)),
    )


def calls_from_spans(spans: Iterable[SpanRecord]) -> list[Call]:
    """The logical calls in ``spans``, in start order.

    Attempts and backoffs that share a parent span belong to one call, split where a fresh
    attempt (resend count 0, no backoff before it) begins: a program span that makes three
    different requests holds three calls. An attempt with no parent in ``spans`` is a call of
    its own. Spans that are not llm-latency's are ignored.
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
        continues = current is not None and (
            member.resend_count > 0
            or (current.backoffs and current.backoffs[-1].start_ns >= current.attempts[-1].start_ns)
        )
        if current is not None and continues:
            current.attempts.append(member)
            continue
        call = _new_call(member, parent)
        calls.append(call)
        if parent is not None and parent_id:
            open_by_parent[parent_id] = call
    for call in calls:
        _close(call)
    return calls


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
    return Call(name, attempt.start_ns, 0.0, [attempt], trace_id=attempt.trace_id)


def _close(call: Call) -> None:
    """The call's bounds: from its first attempt to the end of its last attempt or backoff."""
    ends = [a.start_ns + int(a.duration * 1e9) for a in call.attempts]
    ends += [b.start_ns + int(b.duration * 1e9) for b in call.backoffs]
    call.duration = (max(ends) - call.start_ns) / 1e9


def from_readable_spans(spans: Iterable[Any]) -> list[SpanRecord]:
    """SpanRecords of the SDK's finished spans (``ReadableSpan``)."""
    records = []
    for span in spans:
        context = span.context
        if context is None:
            continue
        parent = span.parent
        scope = span.instrumentation_scope
        records.append(
            SpanRecord(
                trace_id=f"{context.trace_id:032x}",
                span_id=f"{context.span_id:016x}",
                parent_id=None if parent is None else f"{parent.span_id:016x}",
                name=span.name,
                kind=span.kind.name,
                start_ns=span.start_time or 0,
                end_ns=span.end_time or span.start_time or 0,
                attributes=dict(span.attributes or {}),
                scope=None if scope is None else scope.name,
            )
        )
    return records
