"""What llm-latency adds per streamed body chunk, measured on the chunk paths themselves.

``bench/overhead.py`` gets the cost per chunk as the difference between a streamed and a JSON
request, divided by the chunks: a difference of two noisy medians on a shared machine, which
can even come out negative. This measures the per-chunk paths directly, side by side in one
process, on a typical OpenAI stream chunk (one SSE event of about 120 bytes), rounds in
rotating order, medians:

- httpx and httpx2: the response stream llm-latency wraps (``_SyncStream``) iterated, against
  the same chunks iterated bare;
- aiohttp: ``StreamReader.feed_data`` with llm-latency's hook and the stream watched, against
  the same call un-hooked;
- requests: urllib3's ``HTTPResponse._fp_read`` (a read of the body from the socket) with
  llm-latency's hook and the response's attempt, against the same call un-hooked;
- the parts: ``Timeline.chunk`` alone, and SSE counting alone.

    python bench/per_chunk.py
    python bench/per_chunk.py --instructions   # instructions per chunk, counted by callgrind

With ``--instructions`` each path runs in an interpreter of its own under valgrind's callgrind
(``--dump-before=getpgrp``): a warm-up, then ``n`` chunks, then ``2 n``; a chunk's count is
the difference of the two windows over ``n``, which repeats to the instruction whatever else
the machine does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

CHUNK = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{"content":"Hello"}}]}\n\n'
)


def streamed(attempt: Any) -> None:
    """The attempt's response is an LLM route's SSE stream, as its adapter sees the headers:
    its events counted and its body watched for tokens (its first chunk holds the first one)."""
    attempt.llm_route = True
    attempt.response_body("text/event-stream")


def per_call(run: Callable[[int], None], n: int) -> float:
    """Nanoseconds per item of ``run(n)``."""
    started = time.perf_counter_ns()
    run(n)
    return (time.perf_counter_ns() - started) / n


def httpcore_paths() -> dict[str, Callable[[int], None]]:
    from opentelemetry.sdk.trace import TracerProvider

    from llm_latency.adapters.httpcore import _SyncStream
    from llm_latency.emitter import Emitter
    from llm_latency.settings import Settings
    from llm_latency.timeline import Timeline

    emitter = Emitter(TracerProvider().get_tracer("bench"), _meter(), Settings())

    def bare(n: int) -> None:
        for _ in [CHUNK] * n:
            pass

    def wrapped(n: int) -> None:
        attempt = Timeline("POST", "http://127.0.0.1/v1/chat/completions")
        streamed(attempt)
        for _ in _SyncStream([CHUNK] * n, attempt, emitter):
            pass

    return {"httpx/httpx2 bare": bare, "httpx/httpx2 llm-latency": wrapped}


def aiohttp_paths() -> dict[str, Callable[[int], None]]:
    import aiohttp.streams

    from llm_latency.adapters import _aiohttp_attempt
    from llm_latency.timeline import Timeline

    loop = asyncio.new_event_loop()

    class Protocol:
        _reading_paused = False

        def pause_reading(self) -> None:
            pass

        def resume_reading(self) -> None:
            pass

    def reader() -> Any:
        return aiohttp.streams.StreamReader(Protocol(), 2**40, loop=loop)  # type: ignore[arg-type]

    def feed(stream: Any, n: int) -> None:
        feed_data = stream.feed_data
        for _ in range(n):
            feed_data(CHUNK)

    def bare(n: int) -> None:
        # The method as aiohttp defines it, whether or not llm-latency's hook is on the class.
        stream = reader()
        feed_data = getattr(type(stream).feed_data, "__wrapped__", type(stream).feed_data)
        for _ in range(n):
            feed_data(stream, CHUNK)

    def watched(n: int) -> None:
        stream = reader()
        attempt = Timeline("POST", "http://127.0.0.1/v1/chat/completions")
        streamed(attempt)
        _aiohttp_attempt.streams[id(stream)] = attempt
        try:
            feed(stream, n)
        finally:
            _aiohttp_attempt.streams.pop(id(stream), None)
        # The path measured is the one that finds the stream's attempt.
        assert attempt.chunks == n, f"the stream's attempt saw {attempt.chunks} of {n} chunks"

    return {"aiohttp bare": bare, "aiohttp llm-latency": watched}


def requests_paths() -> dict[str, Callable[[int], None]]:
    import io

    from urllib3 import HTTPResponse

    from llm_latency import emitter
    from llm_latency.adapters._urllib3_attempt import ATTEMPT, Attempt
    from llm_latency.timeline import Timeline

    def response(n: int) -> Any:
        return HTTPResponse(io.BytesIO(CHUNK * n), preload_content=False, decode_content=False)

    def bare(n: int) -> None:
        # The method as urllib3 defines it, whether or not llm-latency's hook is on the class.
        resp = response(n)
        fp_read = getattr(HTTPResponse._fp_read, "__wrapped__", HTTPResponse._fp_read)
        for _ in range(n):
            fp_read(resp, len(CHUNK))

    def watched(n: int) -> None:
        resp = response(n)
        attempt = Timeline("POST", "http://127.0.0.1/v1/chat/completions")
        streamed(attempt)
        assert emitter.active is not None
        resp.__dict__[ATTEMPT] = Attempt(attempt, emitter.active)
        fp_read = resp._fp_read
        for _ in range(n):
            fp_read(len(CHUNK))

    return {"requests bare": bare, "requests llm-latency": watched}


def part_paths() -> dict[str, Callable[[int], None]]:
    from llm_latency.sse import SSECounter
    from llm_latency.timeline import Timeline

    def timeline(n: int) -> None:
        chunk = Timeline("POST", "http://x").chunk
        for _ in range(n):
            chunk(CHUNK)

    def watched(n: int) -> None:
        attempt = Timeline("POST", "http://x/v1/chat/completions")
        attempt.llm_route = True
        attempt.response_body("application/json")  # the token watch, no SSE counting
        chunk = attempt.chunk
        for _ in range(n):
            chunk(CHUNK)

    def sse(n: int) -> None:
        feed = SSECounter().feed
        for _ in range(n):
            feed(CHUNK)

    def loop(n: int) -> None:
        for _ in range(n):
            pass

    return {
        "loop alone": loop,
        "Timeline.chunk": timeline,
        "Timeline.chunk, body watched": watched,
        "SSE counting": sse,
    }


def _meter() -> Any:
    from opentelemetry.sdk.metrics import MeterProvider

    return MeterProvider().get_meter("bench")


def all_paths() -> dict[str, Callable[[int], None]]:
    """Every path by name, the aiohttp and urllib3 hooks installed as in a program."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    import llm_latency

    paths = {**httpcore_paths(), **part_paths()}
    llm_latency.instrument(
        tracer_provider=TracerProvider(),
        meter_provider=MeterProvider(),
        clients=["aiohttp", "requests"],
        configure=False,
    )
    paths.update(aiohttp_paths())
    paths.update(requests_paths())
    return paths


def count_worker(name: str, n: int) -> None:
    """Under callgrind: path ``name`` warmed up, then ``n`` and ``2 n`` chunks, each window
    ended by a checkpoint (``os.getpgrp``)."""
    run = all_paths()[name]
    run(n // 4)
    os.getpgrp()
    run(n)
    os.getpgrp()
    run(2 * n)
    os.getpgrp()


def instructions_per_chunk(name: str, n: int) -> float:
    """Instructions path ``name`` costs per chunk (see the module's docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/callgrind.out"
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--dump-before=getpgrp", "--dump-instr=no",
             f"--callgrind-out-file={out}", sys.executable, __file__, "--count-worker", name,
             str(n)],
            check=True, capture_output=True, env={**os.environ, "PYTHONHASHSEED": "0"},
        )  # fmt: skip
        totals = []
        for index in (2, 3):
            with open(f"{out}.{index}") as dump:
                line = next(line for line in dump if line.startswith("totals:"))
                totals.append(int(line.split()[1]))
    return (totals[1] - totals[0]) / n


PAIRS: dict[str, str] = {
    "httpx/httpx2 llm-latency": "httpx/httpx2 bare",
    "aiohttp llm-latency": "aiohttp bare",
    "requests llm-latency": "requests bare",
    "Timeline.chunk": "loop alone",
    "Timeline.chunk, body watched": "loop alone",
    "SSE counting": "loop alone",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--chunks", type=int, default=200_000)
    parser.add_argument("--instructions", action="store_true", help="count them (callgrind)")
    parser.add_argument("--count-worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.count_worker:
        count_worker(args.count_worker[0], int(args.count_worker[1]))
        return
    paths = all_paths()
    if args.instructions:
        n = 2000
        counted = {name: instructions_per_chunk(name, n) for name in paths}
        print(f"instructions per chunk of {len(CHUNK)} bytes (callgrind, {2 * n} against {n})")
        print("| path | instructions per chunk | added by llm-latency |")
        print("|---|---:|---:|")
        for name, value in counted.items():
            base = PAIRS.get(name)
            added = f"{value - counted[base]:,.0f}" if base else "-"
            print(f"| {name} | {value:,.0f} | {added} |")
        return

    results: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            results[name].append(per_call(paths[name], args.chunks))
    median = {name: statistics.median(values) / 1000 for name, values in results.items()}
    print(f"{args.chunks} chunks of {len(CHUNK)} bytes x {args.rounds} rounds, medians")
    print("| path | µs per chunk | added by llm-latency |")
    print("|---|---:|---:|")
    for name in names:
        base = PAIRS.get(name)
        added = f"{median[name] - median[base]:.2f}" if base else "-"
        print(f"| {name} | {median[name]:.2f} | {added} |")


if __name__ == "__main__":
    main()
