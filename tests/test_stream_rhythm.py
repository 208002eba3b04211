"""The stream's rhythm: on the request span of a streamed response, the mean interval between
chunks and the chunks per second after the first; the opt-in
``gen_ai.client.operation.time_per_output_chunk`` histogram (one record per chunk after the
first); probe's text and HTML report show the rhythm."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

import llm_latency
from llm_latency.facts import RATE_DIGITS
from tests.attributes import float_attr, longest_gap_seen
from tests.checks import EARLY, SLACK
from tests.command_line import mock_server, run_cli
from tests.conftest import Telemetry
from tests.servers import LLMServer

CHUNKS = 6
GAP = 0.06  # what the server waits between two chunks (s)
HISTOGRAM = "gen_ai.client.operation.time_per_output_chunk"


async def _stream(server: LLMServer) -> None:
    async with aiohttp.ClientSession() as session:
        url = server.url(chunks=CHUNKS, gap=GAP, sse=1)
        async with session.post(url, json={"stream": True}) as response:
            async for _ in response.content.iter_any():
                pass


async def test_the_request_span_carries_the_rhythm(telemetry: Telemetry, server: LLMServer) -> None:
    await _stream(server)
    span = telemetry.request()
    mean = float_attr(span, "llm_latency.stream.mean_interval")
    rate = float_attr(span, "llm_latency.stream.chunk_rate")
    # the rate is the mean's inverse, rounded to RATE_DIGITS decimals
    assert rate == pytest.approx(1 / mean, abs=0.5 * 10**-RATE_DIGITS)
    # CHUNKS events over CHUNKS - 1 injected gaps, read in CHUNKS to CHUNKS + 1 reads (the
    # [DONE] event may come in a read of its own); reads that coalesce make the mean longer
    assert (CHUNKS - 1) * GAP / CHUNKS - EARLY <= mean <= GAP + SLACK
    assert mean <= longest_gap_seen(span)
    # no histogram record without the opt-in
    assert telemetry.metric_points(HISTOGRAM) == []


async def test_a_response_that_is_not_streamed_has_no_rhythm(
    telemetry: Telemetry, server: LLMServer
) -> None:
    async with aiohttp.ClientSession() as session, session.post(server.url()) as response:
        await response.read()
    attributes = telemetry.request().attributes or {}
    assert "llm_latency.stream.mean_interval" not in attributes
    assert "llm_latency.stream.chunk_rate" not in attributes


async def test_the_opt_in_histogram_records_each_interval(server: LLMServer) -> None:
    telemetry = Telemetry()
    telemetry.instrument(time_per_output_chunk=True)
    try:
        await _stream(server)
    finally:
        llm_latency.uninstrument()
    span = telemetry.request()
    mean = float_attr(span, "llm_latency.stream.mean_interval")
    (point,) = telemetry.metric_points(HISTOGRAM)
    assert dict(point.attributes) == {"server.address": "127.0.0.1"}
    # one record per interval after the first chunk, and together they are the stream's time
    # from its first chunk to its last: the span's mean interval times their number
    assert point.count >= CHUNKS - 1
    assert point.sum == pytest.approx(mean * point.count, rel=1e-6)
    assert point.max >= GAP - EARLY
    assert (CHUNKS - 1) * GAP - EARLY <= point.sum <= (CHUNKS - 1) * GAP + SLACK


def test_probe_shows_the_rhythm_in_text_and_html(tmp_path: Path) -> None:
    html = tmp_path / "report.html"
    with mock_server("--ttfb", "0.01", "--tokens", "5", "--tokens-per-second", "50") as mock:
        result = run_cli("probe", "--stream", "-n", "2", "--html", str(html), mock.url)
    assert result.returncode == 0, result.stderr
    assert "chunks/s)" in result.stdout
    assert "a chunk every " in result.stdout
    assert "  Stream rhythm after the first chunk: a chunk every " in result.stdout
    page = html.read_text()
    assert "<p class='rhythm'>Stream rhythm after the first chunk: a chunk every " in page


def test_probe_shows_no_rhythm_for_a_response_that_is_not_streamed(tmp_path: Path) -> None:
    with mock_server("--ttfb", "0.01", "--tokens", "5") as mock:
        result = run_cli("probe", "-n", "1", mock.url)
    assert result.returncode == 0, result.stderr
    assert "Stream rhythm" not in result.stdout
    assert "a chunk every" not in result.stdout
