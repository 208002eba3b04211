"""The stream's rhythm as probe shows it: how often chunks came after the first one, and how
fast the model decoded (time per output token, tokens per second)."""

from __future__ import annotations

from collections.abc import Sequence

from llm_latency.cli.results import RequestResult
from llm_latency.diagnosis.findings import duration, percentile


def rhythm(mean_interval: float, chunk_rate: float | None) -> str:
    """``every 20.0 ms (50 chunks/s)``: one request's rhythm after its first chunk."""
    rate = f" ({chunk_rate:.3g} chunks/s)" if chunk_rate is not None else ""
    return f"a chunk every {duration(mean_interval)}{rate}"


def endpoint_rhythm(results: Sequence[RequestResult]) -> str | None:
    """An endpoint's rhythm over its streamed requests: the median of their mean intervals and
    rates, and the longest mean interval; None when none streamed two chunks or more."""
    intervals = [r.stream_mean_interval for r in results if r.stream_mean_interval is not None]
    if not intervals:
        return None
    rates = [r.stream_chunk_rate for r in results if r.stream_chunk_rate is not None]
    rate = percentile(rates, 50) if rates else None
    line = f"Stream rhythm after the first chunk: {rhythm(percentile(intervals, 50), rate)}"
    if len(intervals) > 1:
        line += f" at p50, the slowest request every {duration(max(intervals))}"
    return line + f" ({len(intervals)} streamed request{'s' if len(intervals) > 1 else ''})"


def decode_speed(time_per_output_token: float) -> str:
    """``12.5 ms per output token (80 tokens/s)``."""
    rate = f" ({1 / time_per_output_token:.3g} tokens/s)" if time_per_output_token > 0 else ""
    return f"{duration(time_per_output_token)} per output token{rate}"


def answer_facts(result: RequestResult) -> str | None:
    """``first token 212 ms, tokens 12 in, 8 out, 12.5 ms per output token (80 tokens/s)``:
    one request's answer as its server counted it, in the words of the text output; None when
    the server counted nothing and no token came."""
    items = []
    if result.time_to_first_token is not None:
        items.append(f"first token {duration(result.time_to_first_token)}")
    items += token_facts(result)
    return ", ".join(items) or None


def token_facts(result: RequestResult) -> list[str]:
    """``tokens 12 in, 8 out`` and ``12.5 ms per output token (80 tokens/s)``, each where the
    server counted it."""
    items = []
    if result.input_tokens is not None or result.output_tokens is not None:
        counted = (result.input_tokens, result.output_tokens)
        items.append("tokens {} in, {} out".format(*("?" if n is None else n for n in counted)))
    if result.time_per_output_token is not None:
        items.append(decode_speed(result.time_per_output_token))
    return items


def endpoint_decode(results: Sequence[RequestResult]) -> str | None:
    """An endpoint's answers as a benchmark run reports them: time to first token and time per
    output token at p50 (tokens per second), over the streamed requests whose server counted
    their tokens; None when none did."""
    tpots = [r.time_per_output_token for r in results if r.time_per_output_token is not None]
    if not tpots:
        return None
    ttfts = [r.time_to_first_token for r in results if r.time_to_first_token is not None]
    outputs = [r.output_tokens for r in results if r.output_tokens is not None]
    line = f"Decode: {decode_speed(percentile(tpots, 50))} at p50"
    if ttfts:
        line += f", first token after {duration(percentile(ttfts, 50))}"
    if outputs:
        line += f", {percentile([float(n) for n in outputs], 50):.0f} output tokens"
    return line + f" ({len(tpots)} request{'s' if len(tpots) > 1 else ''})"
