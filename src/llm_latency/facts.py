"""What a finished Timeline says about its attempt, as plain values: a pure function of the
Timeline (and of the event-loop lag measured for it), with no OpenTelemetry in it. The emitter
names these facts as attributes and metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from llm_latency import headers
from llm_latency.timeline import PHASE_NAMES, QUEUE, SEND, WAIT, Timeline
from llm_latency.usage import Usage, read_usage


def error_type(error: BaseException) -> str:
    """``error.type`` for an exception: its class name, as the contrib instrumentations use."""
    return type(error).__qualname__


def send_to_first_byte(timeline: Timeline) -> float | None:
    """Seconds from the start of sending the request to its first response byte: the window
    that holds the server's whole processing time (the server may start as soon as the request's
    start reaches it, while the body is still being sent)."""
    send, wait = timeline.bounds_of(SEND), timeline.bounds_of(WAIT)
    if send is None or wait is None:
        return None
    return (wait[1] - send[0]) / 1e9


class LoopLag(NamedTuple):
    """How long an attempt's busy event loop delayed it: per phase (s, indexed like
    ``PHASE_NAMES``), and per gap of ``Timeline.long_gaps`` (ns, in its order); and how long
    the loop's thread waited for a CPU while the attempt was in flight (s): in all
    (``descheduled``), and the part of it that delayed each phase's end (``waited``, s,
    indexed like ``PHASE_NAMES``; empty when none did). ``exemplar``: whether the attempt's
    lag record is to carry its trace exemplar (the first attempt charged in a late stretch)."""

    phases: Sequence[float]
    gaps: Sequence[int] = ()
    descheduled: float = 0.0
    waited: Sequence[float] = ()
    exemplar: bool = True


def provider_max_gap(timeline: Timeline, gap_lags: Sequence[int]) -> int:
    """The stream's longest gap (ns) from its first token, less the loop's lag in it: the
    longest pause of the provider and the network. The wait before the first token (a queue,
    the prompt's prefill, hidden reasoning after the control events) is no pause; a stream
    whose first token was not seen (no token watch, a compressed body) counts from its first
    chunk. Every gap not kept is no longer than the shortest kept, which bounds it when all
    the kept ones were the loop's."""
    watch = timeline.body
    first = watch.first_token_ns if watch is not None else 0
    longest = timeline.token_max_gap_ns if first else timeline.max_gap_ns
    if not any(gap_lags):
        return longest
    kept = timeline.long_gaps
    less_lag = [
        length - lag
        for (length, start, _), lag in zip(kept, gap_lags, strict=True)
        if start >= first
    ]
    return max(max(less_lag, default=0), min(timeline.gap_floor_ns, longest))


#: Rates are rounded to the thousandth.
RATE_DIGITS: Final = 3


def to_ns(seconds: float) -> float:
    """``seconds`` rounded to the nanosecond, the clocks' resolution: a difference, a sum or a
    quotient of floats otherwise shows noise such as 0.016716636000000007 in a trace view. (A
    whole number of ns over ``1e9`` is the float nearest that decimal: no noise. Half the cost
    of ``round(seconds, 9)``, which goes through decimal strings, on every attempt's path.)"""
    return round(seconds * 1e9) / 1e9


@dataclass
class AttemptFacts:
    """One finished attempt's facts; durations in seconds, None when not known."""

    #: Allow-listed response headers found, by lowercase name.
    headers: dict[str, list[str]]
    status: int | None
    #: ``error.type``: the exception's class name, or the status code of a 4xx/5xx response.
    error_type: str | None
    failed_phase: str | None
    server_processing: float | None
    #: Send-to-first-byte window less the server's time, the loop lag charged to it and the
    #: loop thread's wait for a CPU that delayed its phases' ends.
    network_overhead: float | None
    #: Lag charged to the whole attempt: the sum of ``phase_lags``.
    event_loop_lag: float | None
    #: Lag charged to each phase (s, indexed like ``PHASE_NAMES``), None for an attempt not on
    #: an event loop.
    phase_lags: list[float] | None
    time_to_first_chunk: float | None
    stream_events: int | None
    stream_max_gap: float | None
    #: The stream's rhythm after its first chunk: the mean interval between body chunks (s) and
    #: the chunks per second; None for fewer than two chunks.
    stream_mean_interval: float | None
    stream_chunk_rate: float | None
    #: The wait the server asked for before a retry (``retry-after-ms``, ``retry-after``).
    retry_after: float | None
    #: What the server said of the answer's tokens and its own time split; None when the
    #: body was not an LLM answer or said nothing.
    usage: Usage | None = None
    #: How long the event loop's thread waited for a CPU while the attempt was in flight (s):
    #: the machine's share of the loop's lateness, in no phase's lag.
    descheduled: float = 0.0
    #: The part of that wait that delayed each phase's end (s, indexed like ``PHASE_NAMES``;
    #: the send's and the wait's clipped as the overhead leaves them out), None when none did.
    phase_waits: list[float] | None = None
    #: Request start to the first event with generated content (s), streamed answers.
    time_to_first_token: float | None = None
    #: (stream end - first token) / (output tokens - 1), streamed answers with usage whose
    #: first token did not come in their last chunk (s).
    time_per_output_token: float | None = None
    #: Server time / output tokens, answers not streamed: an upper bound (s).
    server_time_per_output_token_max: float | None = None
    #: A streamed answer with content and no usage (OpenAI without ``include_usage``).
    usage_unknown: bool = False
    #: Whether the lag's record carries the attempt's trace exemplar (one attempt per late
    #: stretch of the loop: see ``LoopLag.exemplar``).
    event_loop_lag_exemplar: bool = True
    #: The provider's request id: the first of its request id headers the response carried.
    request_id: str | None = None
    #: The attempt's wait for a pooled connection (s), when it waited.
    queue_time: float | None = None


def token_facts(
    timeline: Timeline, found: dict[str, list[str]], processing: float | None
) -> tuple[Usage | None, float | None, float | None, float | None, bool]:
    """Usage, time to first token, time per output token, the server's upper bound per output
    token and whether a stream's usage is unknown, for an attempt whose body was watched."""
    watch = timeline.body
    if watch is None:
        return None, None, None, None, False
    usage = read_usage(watch, found)
    output = usage.output_tokens
    first_token = tpot = tpot_max = None
    unknown = False
    if watch.streamed:
        if watch.first_token_ns:
            first_token = (watch.first_token_ns - timeline.start_ns) / 1e9
            unknown = output is None
            # No time after the first token (it came in the last chunk, as a tool call sent
            # whole does): the tokens after it say nothing of a pace.
            if output is not None and output > 1 and timeline.last_chunk_ns > watch.first_token_ns:
                tpot = (timeline.last_chunk_ns - watch.first_token_ns) / 1e9 / (output - 1)
                tpot = to_ns(tpot)
    elif output and processing is not None:
        tpot_max = to_ns(processing / output)
    return (None if usage.empty else usage), first_token, tpot, tpot_max, unknown


def read_facts(timeline: Timeline, lag: LoopLag | None, wanted: frozenset[str]) -> AttemptFacts:
    """The facts of a finished attempt. ``lag``: how long its busy event loop delayed it, None
    for an attempt not on a loop; ``wanted``: the response headers to keep."""
    found: dict[str, list[str]] = {}
    if timeline.response_headers is not None and wanted:
        found = headers.select(timeline.response_headers, wanted)
    processing = headers.server_time(found)
    window = send_to_first_byte(timeline)
    request_id = None
    if found:
        for name in headers.REQUEST_ID_HEADERS:
            values = found.get(name)
            if values:
                request_id = values[0]
                break

    lag_total: float | None = None
    phase_lags: list[float] | None = None
    window_lag = 0.0  # the lag in the send-to-first-byte window: the one the overhead excludes
    window_waited = 0.0  # the machine's share of the loop's delay in that window
    phase_waits: list[float] | None = None
    if lag is not None:
        phase_lags = list(lag.phases)
        send_lag, wait_lag = phase_lags[SEND], phase_lags[WAIT]
        window_lag = send_lag + wait_lag
        if lag.waited:
            phase_waits = list(lag.waited)
            window_waited = phase_waits[SEND] + phase_waits[WAIT]
        if processing is not None and window is not None and (window_lag or window_waited):
            # The response cannot have come before the server's processing was done: the loop
            # delayed it by no more than what the processing time leaves of the window (the
            # wait keeps its share of that first: the server's time ends in it). The program's
            # share is charged first, as it was before the machine's was told apart; the
            # machine's takes what is left, so the overhead is never made negative.
            left = max(window - processing, 0.0)
            window_lag = min(window_lag, left)
            window_waited = min(window_waited, left - window_lag)
            phase_lags[WAIT] = to_ns(min(wait_lag, window_lag))
            phase_lags[SEND] = to_ns(window_lag - phase_lags[WAIT])
            if phase_waits is not None:  # the same split, so the phases add up to what it left
                phase_waits[WAIT] = to_ns(min(phase_waits[WAIT], window_waited))
                phase_waits[SEND] = to_ns(window_waited - phase_waits[WAIT])
        # Each phase's lag is whole ns over 1e9 (or rounded above); only a sum needs rounding.
        lag_total = to_ns(sum(phase_lags)) if any(phase_lags) else 0.0
    overhead = None
    if processing is not None and window is not None:
        overhead = to_ns(window - processing - window_lag - window_waited)

    first_chunk = events = max_gap = None
    if timeline.stream is not None and timeline.first_chunk_ns:
        first_chunk = (timeline.first_chunk_ns - timeline.start_ns) / 1e9
        events = timeline.stream.events
        max_gap = provider_max_gap(timeline, lag.gaps if lag else ()) / 1e9
    mean_interval = chunk_rate = None
    if first_chunk is not None and timeline.chunks > 1:
        span_ns = timeline.last_chunk_ns - timeline.first_chunk_ns
        mean_interval = to_ns(span_ns / 1e9 / (timeline.chunks - 1))
        chunk_rate = (
            round((timeline.chunks - 1) / (span_ns / 1e9), RATE_DIGITS) if span_ns > 0 else None
        )

    usage, first_token, tpot, tpot_max, unknown = token_facts(timeline, found, processing)

    status = timeline.status_code
    error = timeline.error
    kind: str | None = None
    failed_phase = None
    if error is not None:
        kind = error_type(error)
        if timeline.failed_phase is not None:
            failed_phase = PHASE_NAMES[timeline.failed_phase]
    elif status is not None and status >= 400:
        kind = str(status)
    return AttemptFacts(
        headers=found,
        status=status,
        error_type=kind,
        failed_phase=failed_phase,
        server_processing=processing,
        network_overhead=overhead,
        event_loop_lag=lag_total,
        phase_lags=phase_lags,
        time_to_first_chunk=first_chunk,
        stream_events=events,
        stream_max_gap=max_gap,
        stream_mean_interval=mean_interval,
        stream_chunk_rate=chunk_rate,
        retry_after=headers.retry_after(
            headers.first(found, "retry-after-ms"), headers.first(found, "retry-after")
        )
        if "retry-after-ms" in found or "retry-after" in found
        else None,
        usage=usage,
        time_to_first_token=first_token,
        time_per_output_token=tpot,
        server_time_per_output_token_max=tpot_max,
        usage_unknown=unknown,
        descheduled=lag.descheduled if lag is not None else 0.0,
        phase_waits=phase_waits,
        event_loop_lag_exemplar=lag is None or lag.exemplar,
        request_id=request_id,
        queue_time=timeline.duration_of(QUEUE),
    )
