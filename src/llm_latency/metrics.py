"""The metrics of docs/telemetry.md, recorded once per finished attempt.

Histograms go through the SDK on each attempt (the request duration, the time to first chunk,
the phases and the loop lag carry trace exemplars, the loop lag's from the first attempt it
delayed in each late stretch; the server's time does not, its attempt's trace is the request
duration's exemplar). Counters and the rate-limit gauge are kept as
in-process tallies and reported by observable instruments when the SDK collects (created once
per meter, ``observables``): a sum or a last value read once per export interval is exactly
what recording it on every attempt would export, at a fraction of the cost on the request path.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Meter, NoOpMeter, Observation

from llm_latency import forks, headers, semconv
from llm_latency.attempt_record import AttemptRecord
from llm_latency.facts import AttemptFacts
from llm_latency.histograms import NO_TRACE, HistogramRecorder
from llm_latency.lag_monitor import LATE_NS
from llm_latency.observables import Observer
from llm_latency.timeline import CONNECT, DNS, PHASE_NAMES, PROXY, QUEUE, TLS

Attributes = tuple[tuple[str, Any], ...]
#: An answer's record attributes: its times', its input tokens', its output tokens'.
_AnswerAttributes = tuple[dict[str, Any], dict[str, Any], dict[str, Any]]

#: The phases ``llm_latency.phase.duration`` records by default (``phase_metrics="setup"``): those
#: whose presence is itself the news (the attempt waited for a connection, or set one up, a
#: proxy's tunnel included). The others (send, wait, receive) are on the phase spans, whose
#: distributions the Collector's span metrics compute; ``queue`` exists only when the attempt
#: waited.
SETUP_PHASES: Final = frozenset({QUEUE, DNS, CONNECT, PROXY, TLS})
#: ``instrument(phase_metrics=...)``: the phases recorded in-process for each choice.
PHASE_METRICS: Final = {"setup": SETUP_PHASES, "all": frozenset(range(len(PHASE_NAMES)))}
#: ``llm_latency.event_loop.lag`` is recorded for an attempt whose lag reached this (s): the
#: monitor's own threshold, below which a late tick is the loop's ordinary jitter. The count of
#: the histogram, over the request count, is the share of attempts that lagged.
LAG_RECORDED_FROM: Final = LATE_NS / 1e9

#: Host, model and provider combinations whose answer attributes are kept (beyond: built per
#: answer).
MAX_ANSWER_SETS: Final = 256

#: Seconds a rate-limit remaining value is reported at most after the response that gave it.
RATELIMIT_MAX_AGE = 300.0

#: Each rate-limit remaining header's place in the provider profiles' order.
_PROFILE_ORDER: Final = {name: i for i, name in enumerate(headers.RATELIMIT_REMAINING_HEADERS)}

_ALL_TALLIES: weakref.WeakSet[_Tallies] = weakref.WeakSet()


@forks.at_fork
def _reset_after_fork() -> None:
    for tallies in list(_ALL_TALLIES):
        tallies._after_fork()


class _Tallies:
    """Thread-safe running totals (or last values) per attribute set."""

    def __init__(self) -> None:
        self._values: dict[Attributes, float] = {}
        self._lock = threading.Lock()
        _ALL_TALLIES.add(self)

    def _after_fork(self) -> None:
        # A forked worker starts with one thread: a lock held by another thread of the parent
        # at the fork would stay held forever. The totals so far are the parent's to report.
        self._lock = threading.Lock()
        self._values = {}

    def add(self, key: Attributes, amount: float = 1) -> None:
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount

    def observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            items = list(self._values.items())
        return [Observation(value, dict(key)) for key, value in items]


class _FreshValues(_Tallies):
    """Last values per attribute set, each reported only until it goes stale."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        self._until: dict[Attributes, float] = {}

    def _after_fork(self) -> None:
        super()._after_fork()
        self._until = {}

    def set_fresh(self, key: Attributes, value: float, for_seconds: float) -> None:
        """``value`` is the current one for ``for_seconds`` from now."""
        with self._lock:
            self._values[key] = value
            self._until[key] = self._clock() + for_seconds

    def observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        now = self._clock()
        with self._lock:
            for key in [key for key, until in self._until.items() if until <= now]:
                del self._until[key]
                del self._values[key]
            items = list(self._values.items())
        return [Observation(value, dict(key)) for key, value in items]


class AttemptMetrics:
    """Records finished attempts: the histograms into a meter's instruments, the counters and
    the rate-limit gauge into tallies that the observable instruments read (``observables``).
    ``meter``: None records nothing into histograms until :meth:`use_meter`;
    ``phase_metrics``: a key of :data:`PHASE_METRICS` (``Settings`` checked it), the phases
    recorded. ``old_genai``: False when the GenAI opt-in asks for the released names only
    (``semconv.GENAI_TABLE``): the old GenAI histograms are then not created, and their records
    do nothing (``genai_metrics`` records the released ones)."""

    def __init__(self, meter: Meter | None, phase_metrics: str, old_genai: bool = True) -> None:
        #: The phases (``timeline`` indexes) whose durations are recorded.
        self.phases_recorded = PHASE_METRICS[phase_metrics]
        self._old_genai = old_genai
        self._answer_sets: dict[tuple[str, Any, Any], _AnswerAttributes] = {}
        self.retries = _Tallies()
        self.rate_limited = _Tallies()
        self.connections = _Tallies()
        self.ratelimit_remaining = _FreshValues()
        self.use_meter(NoOpMeter(semconv.SCOPE_NAME) if meter is None else meter)

    def use_meter(self, meter: Meter) -> None:
        """Record the histograms into ``meter``'s instruments from now on (the meter llm-latency
        follows was settled: see ``tracer_handle``)."""
        self.request_duration = HistogramRecorder(
            meter.create_histogram(
                semconv.HTTP_CLIENT_REQUEST_DURATION,
                unit="s",
                description="Duration of HTTP client requests, to the end of the body or stream.",
                explicit_bucket_boundaries_advisory=semconv.DURATION_BUCKETS,
            )
        )
        self.phase_duration = HistogramRecorder(
            meter.create_histogram(
                semconv.PHASE_DURATION,
                unit="s",
                description="Time an HTTP attempt spent waiting for a connection or setting one up "
                "(queue, dns, connect, tls), or in any phase with phase_metrics='all'.",
                explicit_bucket_boundaries_advisory=semconv.DURATION_BUCKETS,
            )
        )
        self.server_processing = HistogramRecorder(
            meter.create_histogram(
                semconv.SERVER_PROCESSING_TIME,
                unit="s",
                description="Server processing time the provider reported (openai-processing-ms).",
                explicit_bucket_boundaries_advisory=semconv.DURATION_BUCKETS,
            )
        )
        self.time_to_first_chunk = _old_genai(meter, "time to first chunk", self._old_genai)
        self.time_per_output_chunk = _old_genai(meter, "time per output chunk", self._old_genai)
        self.event_loop_lag = HistogramRecorder(
            meter.create_histogram(
                semconv.EVENT_LOOP_LAG,
                unit="s",
                description="Time the program's event loop was busy during an attempt (asyncio "
                "clients), for the attempts that lagged: the program's share of that time, not the "
                "provider's.",
                explicit_bucket_boundaries_advisory=semconv.DURATION_BUCKETS,
            )
        )
        self.token_usage = _old_genai(meter, "tokens per operation and type", self._old_genai)
        self.time_per_output_token = HistogramRecorder(
            meter.create_histogram(
                semconv.TIME_PER_OUTPUT_TOKEN,
                unit="s",
                description="Time per output token of a streamed LLM call: (stream end - first "
                "token) / (output tokens - 1).",
                explicit_bucket_boundaries_advisory=semconv.TOKEN_INTERVAL_BUCKETS,
            )
        )
        self.time_to_first_token = HistogramRecorder(
            meter.create_histogram(
                semconv.TIME_TO_FIRST_TOKEN,
                unit="s",
                description="Time from the start of a streamed LLM call to its first generated "
                "content (not a control event or an empty delta).",
                explicit_bucket_boundaries_advisory=semconv.DURATION_BUCKETS,
            )
        )

    def observers(self) -> dict[str, Observer]:
        """What the observable instruments read of this instrumentation, by instrument name."""
        return {
            semconv.RETRIES: self.retries.observe,
            semconv.RATE_LIMITED: self.rate_limited.observe,
            semconv.CONNECTIONS: self.connections.observe,
            semconv.RATELIMIT_REMAINING: self.ratelimit_remaining.observe,
        }

    def phase(self, attributes: Mapping[str, Any], seconds: float, context: Context) -> None:
        """Record the time one attempt spent in a phase (``attributes``: the phase and host,
        shared with the phase's span, see ``PhaseSpanWriter.attributes``). The caller records
        only the phases of :attr:`phases_recorded`."""
        self.phase_duration.record(seconds, attributes, context)

    def record(self, attempt: AttemptRecord, facts: AttemptFacts, context: Context) -> None:
        """Record one finished attempt: its duration, the provider's time, the first chunk, the
        loop lag, 429s, connection reuse and the rate-limit state its headers give."""
        host = attempt.host
        timeline = attempt.timeline
        attributes: dict[str, Any] = {
            semconv.HTTP_REQUEST_METHOD: attempt.method,
            semconv.SERVER_ADDRESS: host,
        }
        if attempt.port is not None:
            attributes[semconv.SERVER_PORT] = attempt.port
        status = facts.status
        if status is not None:
            attributes[semconv.HTTP_RESPONSE_STATUS_CODE] = status
        if facts.error_type is not None:
            attributes[semconv.ERROR_TYPE] = facts.error_type
        self.request_duration.record(timeline.duration, attributes, context)
        by_host = None
        if facts.server_processing is not None:
            by_host = {semconv.SERVER_ADDRESS: host}
            # No trace context: the request duration's exemplar links the same trace, and the
            # exemplar is about a third of an SDK record.
            self.server_processing.record(facts.server_processing, by_host, NO_TRACE)
        if facts.time_to_first_chunk is not None:
            by_host = by_host or {semconv.SERVER_ADDRESS: host}
            self.time_to_first_chunk.record(facts.time_to_first_chunk, by_host, context)
            gaps = timeline.gaps
            if gaps:
                # No trace context: an exemplar per chunk would cost more than the record
                # itself, and the time to first chunk's already links the attempt's trace.
                record_gap = self.time_per_output_chunk.record
                for gap in gaps:
                    record_gap(gap / 1e9, by_host, NO_TRACE)
        lag = facts.event_loop_lag
        if lag is not None and lag >= LAG_RECORDED_FROM:
            by_host = by_host or {semconv.SERVER_ADDRESS: host}
            # The trace exemplar of the first attempt charged in each late stretch only: a
            # saturated loop delays every attempt, and the histogram keeps one per bucket.
            self.event_loop_lag.record(
                lag, by_host, context if facts.event_loop_lag_exemplar else NO_TRACE
            )
        if status == 429:
            self.rate_limited.add(((semconv.SERVER_ADDRESS, host),))
        if timeline.reused is not None:
            self.connections.add(
                ((semconv.SERVER_ADDRESS, host), (semconv.CONNECTION_REUSED, timeline.reused))
            )
        found = facts.headers
        if not found:
            return
        # In the order of the provider profiles, without a call per header that is absent.
        kinds = headers.RATELIMIT_REMAINING_HEADERS
        present = [h for h in found if h in kinds]
        if len(present) > 1:
            present.sort(key=_PROFILE_ORDER.__getitem__)
        for header in present:
            kind = kinds[header]
            remaining = headers.parse_number(found[header][0])
            if remaining is not None:
                reset_header = headers.RATELIMIT_RESET_HEADERS[header]
                reset = None if reset_header is None else headers.first(found, reset_header)
                self.ratelimit(host, kind, remaining, headers.parse_reset(reset))

    def answer(
        self, host: str, facts: AttemptFacts, answer: Mapping[str, Any], context: Context
    ) -> None:
        """Record what an attempt that carried an LLM answer says of its tokens: its time to
        first token and per output token (streams), and its token counts (at most one record
        per token type); ``answer``: its GenAI attributes."""
        times, inputs, outputs = self._answer_attributes(host, answer)
        if facts.time_to_first_token is not None:
            self.time_to_first_token.record(facts.time_to_first_token, times, context)
        usage = facts.usage
        if usage is None:
            return
        # No trace context: the time to first token's exemplar, and the request duration's,
        # link the same trace.
        if facts.time_per_output_token is not None:
            self.time_per_output_token.record(facts.time_per_output_token, times, NO_TRACE)
        if usage.input_tokens is not None:
            self.token_usage.record(usage.input_tokens, inputs, NO_TRACE)
        if usage.output_tokens is not None:
            self.token_usage.record(usage.output_tokens, outputs, NO_TRACE)

    def _answer_attributes(self, host: str, answer: Mapping[str, Any]) -> _AnswerAttributes:
        """The attributes of an answer's records: the host and model (its times), and those
        with the provider and the token type (its input and output counts). Built once per
        host, model and provider (up to :data:`MAX_ANSWER_SETS` of them)."""
        model = answer.get(semconv.GEN_AI_RESPONSE_MODEL)
        provider = answer.get(semconv.GEN_AI_PROVIDER_NAME)
        key = (host, model, provider)
        found = self._answer_sets.get(key)
        if found is None:
            times: dict[str, Any] = {semconv.SERVER_ADDRESS: host}
            if model is not None:
                times[semconv.GEN_AI_RESPONSE_MODEL] = model
            tokens = dict(times)
            if provider is not None:
                tokens[semconv.GEN_AI_PROVIDER_NAME] = provider
            found = (
                times,
                {**tokens, semconv.GEN_AI_TOKEN_TYPE: semconv.GEN_AI_TOKEN_TYPE_INPUT},
                {**tokens, semconv.GEN_AI_TOKEN_TYPE: semconv.GEN_AI_TOKEN_TYPE_OUTPUT},
            )
            if len(self._answer_sets) < MAX_ANSWER_SETS:
                self._answer_sets[key] = found
        return found

    def retry(self, host: str, reason: str | None) -> None:
        """One attempt was retried, because of ``reason`` (a status code or an error type)."""
        if reason is not None and reason.isdigit():
            key: Attributes = (
                (semconv.SERVER_ADDRESS, host),
                (semconv.HTTP_RESPONSE_STATUS_CODE, int(reason)),
            )
        else:
            key = ((semconv.SERVER_ADDRESS, host), (semconv.ERROR_TYPE, reason or "unknown"))
        self.retries.add(key)

    def ratelimit(
        self, host: str, kind: str, remaining: float, reset_in: float | None = None
    ) -> None:
        """The latest rate-limit remaining value for ``host`` (requests or tokens). It is
        reported until the provider resets the window (``reset_in`` seconds), and never for
        longer than ``RATELIMIT_MAX_AGE``: a value the program no longer refreshes (it is
        idle, or gone) is not reported forever."""
        fresh_for = RATELIMIT_MAX_AGE if reset_in is None else min(reset_in, RATELIMIT_MAX_AGE)
        self.ratelimit_remaining.set_fresh(
            ((semconv.SERVER_ADDRESS, host), (semconv.RATELIMIT_KIND, kind)), remaining, fresh_for
        )


class _NoRecord:
    """A histogram the GenAI opt-in replaced: its records do nothing."""

    def record(self, value: float, attributes: Mapping[str, Any], context: Context) -> None:
        pass


def histogram(meter: Meter, instrument: semconv.Instrument) -> HistogramRecorder:
    """The recorder of a histogram of ``semconv.GENAI_TABLE``."""
    return HistogramRecorder(
        meter.create_histogram(
            instrument.name,
            unit=instrument.unit,
            description=instrument.description,
            explicit_bucket_boundaries_advisory=instrument.buckets,
        )
    )


def _old_genai(meter: Meter, concept: str, created: bool) -> HistogramRecorder | _NoRecord:
    """The old name's histogram of ``concept`` (``semconv.GENAI_TABLE``), unless the opt-in
    replaced it (``created`` False)."""
    old = semconv.genai_row(concept).old
    assert isinstance(old, semconv.Instrument), concept
    return histogram(meter, old) if created else _NoRecord()
