"""The plain records the diagnosis reads: spans as read back (:class:`SpanRecord`), and the
attempts, backoffs and calls made of them (:mod:`~llm_latency.diagnosis.reading` reads spans into
them, :mod:`~llm_latency.diagnosis.grouping` groups them into calls)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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
    service: str | None = None  # the resource's service.name, when known


#: The phases that set a connection up: what a pooled connection saves (``proxy``: reaching a
#: proxy and opening its tunnel, when the adapter shows it as a phase of its own).
SETUP_PHASES = ("dns", "proxy", "connect", "tls")


@dataclass(frozen=True)
class Phase:
    """One phase of an attempt: offset from the attempt's start and duration, in seconds;
    ``lag``: how much of it was the program's own event-loop stall (None when not measured:
    sync clients, or spans from before the measurement existed); ``descheduled``: how much
    the machine held the loop's thread off a CPU (None when not measured or none)."""

    name: str
    start: float
    duration: float
    lag: float | None = None
    descheduled: float | None = None

    @property
    def net(self) -> float:
        """The phase's duration without the program's own stall and the machine's wait for a
        CPU: what the network, the peer or the pool took (s)."""
        return max(self.duration - (self.lag or 0.0) - (self.descheduled or 0.0), 0.0)

    @property
    def held(self) -> float:
        """What this side's loop held the phase (s): its stall and its wait for a CPU."""
        return (self.lag or 0.0) + (self.descheduled or 0.0)


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
    #: The client's setting that closed the connection after the attempt
    #: (``llm_latency.connection.closed_by``: ``force_close=True``, ``Connection: close``).
    closed_by: str | None = None
    request_id: str | None = None
    server_processing: float | None = None
    network_overhead: float | None = None
    event_loop_lag: float | None = None
    #: How long the loop's thread waited for a CPU during the attempt (the machine's share).
    descheduled: float | None = None
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
    #: A stream with content and no usage (``llm_latency.usage.unknown``).
    usage_unknown: bool = False
    server_time_per_output_token_max: float | None = None
    #: The server's own split of its time, where the provider says it (s).
    server_queue: float | None = None
    server_prefill: float | None = None
    server_decode: float | None = None
    #: Seconds the server asked to wait before a retry (``retry-after-ms``, else a number of
    #: seconds in ``retry-after``), on a refusal.
    retry_after: float | None = None
    #: The program that made the attempt (its resource's ``service.name``), when known.
    service: str | None = None

    def phase(self, name: str) -> float | None:
        """The duration of phase ``name`` (s), or None when it did not happen."""
        for each in self.phases:
            if each.name == name:
                return each.duration
        return None

    def net(self, name: str) -> float | None:
        """Phase ``name``'s duration without the program's own loop stall and the machine's
        wait for a CPU (s), or None when it did not happen: what a network rule may look at."""
        for each in self.phases:
            if each.name == name:
                return each.net
        return None

    @property
    def connection_setup(self) -> float:
        """DNS + proxy + TCP + TLS (s), the program's own stall and the machine's wait taken
        off: what a pooled connection would have saved."""
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
    """A ``retry.backoff`` span: the wait between two attempts of one call; ``inferred``: no
    such span, but the gap between two attempts of a retry of the program's own (the same
    request again under the same parent after a refusal or a failure)."""

    start_ns: int
    duration: float
    reason: str | None = None
    retry_after: float | None = None
    inferred: bool = False

    @property
    def beyond_asked(self) -> float | None:
        """Seconds waited beyond what the server asked (``retry_after``), or None when it
        asked nothing."""
        if self.retry_after is None:
            return None
        return max(self.duration - self.retry_after, 0.0)


@dataclass
class Call:
    """One logical call: its attempts and the backoffs between them, in start order."""

    name: str
    start_ns: int
    duration: float
    attempts: list[Attempt]
    backoffs: list[Backoff] = field(default_factory=list)
    trace_id: str = ""
    #: The SDK whose call this is (``llm_latency.sdk`` on the call span), when llm-latency
    #: opened it.
    sdk: str | None = None

    @property
    def backoff_time(self) -> float:
        """Seconds spent waiting between attempts."""
        return sum(b.duration for b in self.backoffs)
