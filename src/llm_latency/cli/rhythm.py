"""The stream's rhythm as probe shows it: how often chunks came after the first one."""

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
