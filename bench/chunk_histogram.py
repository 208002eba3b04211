"""What the opt-in ``gen_ai.client.operation.time_per_output_chunk`` histogram costs per chunk.

A streamed attempt of ``--chunks`` SSE chunks goes through the emitter end to end (start, each
chunk recorded on the Timeline, finish: spans and metrics into a real SDK with an in-memory
metric reader), with ``time_per_output_chunk`` off and on, in alternating rounds, timed in the
thread's CPU time (the rest of a shared machine's load is not counted). The medians' difference
divided by the chunks is the histogram's cost per chunk: keeping each interval on the hot path,
and one SDK histogram record per chunk when the attempt ends.

    python bench/chunk_histogram.py
"""

from __future__ import annotations

import argparse
import statistics
import time

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from llm_latency.emitter import Emitter
from llm_latency.settings import Settings
from llm_latency.sse import SSECounter
from llm_latency.timeline import RECEIVE, SEND, WAIT, Timeline

CHUNK = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{"content":"Hello"}}]}\n\n'
)


def emitter(opt_in: bool) -> Emitter:
    meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("bench")
    return Emitter(
        TracerProvider().get_tracer("bench"),
        meter,
        Settings(time_per_output_chunk=opt_in),
    )


def attempt(target: Emitter, chunks: int) -> None:
    """One streamed attempt, start to finish."""
    timeline = Timeline("POST", "http://127.0.0.1/v1/chat/completions")
    target.start(timeline, "127.0.0.1", 8000, "/v1/chat/completions")
    timeline.begin(SEND)
    timeline.advance(WAIT)
    timeline.status_code = 200
    timeline.advance(RECEIVE)
    timeline.stream = SSECounter()
    chunk = timeline.chunk
    for _ in range(chunks):
        chunk(CHUNK)
    target.finish(timeline)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=200, help="chunks per attempt")
    parser.add_argument("--attempts", type=int, default=200, help="attempts per round")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    emitters = {"off": emitter(False), "on": emitter(True)}
    times: dict[str, list[float]] = {"off": [], "on": []}
    for round_number in range(args.rounds):
        order = ["off", "on"] if round_number % 2 == 0 else ["on", "off"]
        for name in order:
            started = time.thread_time_ns()
            for _ in range(args.attempts):
                attempt(emitters[name], args.chunks)
            elapsed = time.thread_time_ns() - started
            times[name].append(elapsed / args.attempts / args.chunks)
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print(f"{args.chunks} chunks per attempt, {args.attempts} attempts x {args.rounds} rounds")
    print(f"time_per_output_chunk off: {off:8.0f} ns per chunk (the whole attempt / chunks)")
    print(f"time_per_output_chunk on:  {on:8.0f} ns per chunk")
    print(f"the histogram's cost:      {on - off:8.0f} ns per chunk ({on / off:.2f}x)")


if __name__ == "__main__":
    main()
