"""The GenAI metrics under their released names (semantic-conventions-genai v0.1.0), recorded
when ``OTEL_SEMCONV_STABILITY_OPT_IN`` asks for them (``gen_ai_latest_experimental``, or
``/dup`` beside the old ones): the emitter then runs :meth:`GenAIMetrics.record` after each
attempt's other records. Without the opt-in nothing here runs: the default path is
``metrics.AttemptMetrics`` alone, as before.

What changes against the old names (``semconv.GENAI_TABLE``): the time to first chunk and per
output chunk are ``gen_ai.client.inference.*``, with the conventions' buckets and the GenAI
attributes they require (``gen_ai.operation.name`` where the route says it,
``gen_ai.provider.name`` where the host or route does); the token histogram by type becomes
monotonic counters per kind of token, by ``gen_ai.token.modality`` (``unknown``: llm-latency
reads no provider's per-modality breakdown), and two histograms of the tokens per operation,
not broken down by modality.

The counters are the SDK's own (``Counter.add``), not the in-process tallies of
``metrics``: they exist only under the opt-in, and an answer adds to two to five of them.
"""

from __future__ import annotations

from typing import Any, Final

from opentelemetry.context import Context
from opentelemetry.metrics import Counter, Meter, NoOpMeter

from llm_latency import semconv
from llm_latency.attempt_record import AttemptRecord
from llm_latency.facts import AttemptFacts
from llm_latency.histograms import NO_TRACE
from llm_latency.metrics import MAX_ANSWER_SETS, histogram
from llm_latency.provider_schema import FETCH_RESPONSE

_GenAIKey = tuple[str, int | None, str | None, str | None, str | None, str | None]
#: An attempt's attributes: its durations' and token histograms' (``error.type`` included),
#: and its token counters' (with ``gen_ai.token.modality``, without ``error.type``).
_GenAIAttributes = tuple[dict[str, Any], dict[str, Any]]

#: The token counters, by the ``Usage`` field each counts (``semconv.GENAI_TABLE``).
_COUNTED: Final = tuple(
    (row.usage, row.latest)
    for row in semconv.GENAI_TABLE
    if isinstance(row.latest, semconv.Instrument) and row.latest.kind == "counter"
)


def _latest(concept: str) -> semconv.Instrument:
    latest = semconv.genai_row(concept).latest
    assert isinstance(latest, semconv.Instrument), concept
    return latest


class GenAIMetrics:
    """Records finished attempts into the released GenAI instruments. ``meter``: None records
    nothing until :meth:`use_meter`."""

    def __init__(self, meter: Meter | None) -> None:
        self._sets: dict[_GenAIKey, _GenAIAttributes] = {}
        self.use_meter(NoOpMeter(semconv.SCOPE_NAME) if meter is None else meter)

    def use_meter(self, meter: Meter) -> None:
        """Record into ``meter``'s instruments from now on."""
        self.time_to_first_chunk = histogram(meter, _latest("time to first chunk"))
        self.time_per_output_chunk = histogram(meter, _latest("time per output chunk"))
        self.input_tokens = histogram(meter, _latest("input tokens per operation"))
        self.output_tokens = histogram(meter, _latest("output tokens per operation"))
        self.counters: tuple[tuple[str, Counter], ...] = tuple(
            (
                field,
                meter.create_counter(
                    instrument.name, unit=instrument.unit, description=instrument.description
                ),
            )
            for field, instrument in _COUNTED
        )

    def record(self, attempt: AttemptRecord, facts: AttemptFacts, context: Context) -> None:
        """Record one finished attempt: its time to first chunk and the intervals after it (a
        stream), and the tokens of its answer (an attempt that carried one)."""
        answered = facts.usage is not None or facts.time_to_first_token is not None
        if facts.time_to_first_chunk is None and not answered:
            return
        durations, counted = self._attributes(attempt, facts)
        if facts.time_to_first_chunk is not None:
            self.time_to_first_chunk.record(facts.time_to_first_chunk, durations, context)
            gaps = attempt.timeline.gaps
            if gaps:
                record_gap = self.time_per_output_chunk.record
                for gap in gaps:
                    record_gap(gap / 1e9, durations, NO_TRACE)
        route = attempt.route
        if not answered or (route is not None and route.operation == FETCH_RESPONSE):
            return  # the conventions: no token usage for a fetched response
        usage = facts.usage
        # No trace context: the time to first chunk's exemplar, and the request duration's,
        # link the same trace.
        if usage is not None:
            if usage.input_tokens is not None:
                self.input_tokens.record(usage.input_tokens, durations, NO_TRACE)
            if usage.output_tokens is not None:
                self.output_tokens.record(usage.output_tokens, durations, NO_TRACE)
        for field, counter in self.counters:
            count = None if usage is None else getattr(usage, field)
            if count is not None:
                counter.add(count, counted, NO_TRACE)
            elif field in ("input_tokens", "output_tokens"):
                # The conventions: an operation whose answer carried no usage counts 0, with
                # the modality unknown (the series exists; the histograms get no false 0).
                counter.add(0, counted, NO_TRACE)

    def _attributes(self, attempt: AttemptRecord, facts: AttemptFacts) -> _GenAIAttributes:
        """The attributes of an attempt's records, built once per host, port, operation,
        provider, model and error (up to ``MAX_ANSWER_SETS`` of them)."""
        route = attempt.route
        operation = None if route is None else route.operation
        provider = attempt.provider
        model = None if facts.usage is None else facts.usage.model
        key = (attempt.host, attempt.port, operation, provider, model, facts.error_type)
        found = self._sets.get(key)
        if found is None:
            base: dict[str, Any] = {semconv.SERVER_ADDRESS: attempt.host}
            if attempt.port is not None:
                base[semconv.SERVER_PORT] = attempt.port
            if operation is not None:
                base[semconv.GEN_AI_OPERATION_NAME] = operation
            if provider is not None:
                base[semconv.GEN_AI_PROVIDER_NAME] = provider
            if model is not None:
                base[semconv.GEN_AI_RESPONSE_MODEL] = model
            durations = dict(base)
            if facts.error_type is not None:
                durations[semconv.ERROR_TYPE] = facts.error_type
            counted = {**base, semconv.GEN_AI_TOKEN_MODALITY: semconv.GEN_AI_TOKEN_MODALITY_UNKNOWN}
            found = (durations, counted)
            if len(self._sets) < MAX_ANSWER_SETS:
                self._sets[key] = found
        return found
