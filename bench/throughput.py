"""Throughput with llm-latency against without, on loopback, where the plugin's cost shows most.

The loopback server of ``overhead.py`` runs in its own process; each mode runs in a fresh
interpreter for several rounds (rotating order): aiohttp with ``--concurrency`` requests in
flight for ``--seconds``, counting completed requests. Modes: bare, the official
instrumentation, llm-latency (phase spans on and off). Reported: median requests per second,
the ratio to bare and to the official instrumentation (target for llm-latency: at least 1.0),
and the client's CPU time per request.

``--parts`` adds two modes that take llm-latency apart: without the event-loop lag monitor
(at saturation every attempt ends in a late stretch of the loop and pays the lag path), and
without the monitor and the phase spans. The monitor has no switch in the public API: these
modes replace the lookup of the running loop's monitor (in ``llm_latency.in_flight``), for
measurement only.

    python bench/throughput.py
    python bench/throughput.py --quick
    python bench/throughput.py --parts
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from overhead import MODES, _instrument, loopback_server, serve

#: The modes of ``--parts``: llm-latency's mode each runs, with the loop-lag monitor off.
NO_LAG_MODES = {
    "llm-latency-no-loop-lag": "llm-latency",
    "llm-latency-no-loop-lag-no-phase-spans": "llm-latency-no-phase-spans",
}


def work(mode: str, port: int, seconds: float, concurrency: int, stream: bool) -> dict[str, float]:
    import aiohttp

    if mode in NO_LAG_MODES:
        import llm_latency.in_flight

        llm_latency.in_flight.monitor_of_running_loop = lambda: None  # type: ignore[attr-defined]
        mode = NO_LAG_MODES[mode]
    if mode != "bare":
        _instrument("aiohttp", mode)
    url = f"http://127.0.0.1:{port}/v1/chat/completions" + ("?stream=1" if stream else "")
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}

    async def main() -> dict[str, float]:
        done = 0
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def one() -> None:
                async with session.post(url, json=payload) as response:
                    async for _ in response.content.iter_any():
                        pass

            for _ in range(50):  # warm-up
                await one()
            deadline = time.perf_counter() + seconds

            async def loop() -> None:
                nonlocal done
                while time.perf_counter() < deadline:
                    await one()
                    done += 1

            started = time.perf_counter()
            cpu = time.process_time()
            await asyncio.gather(*(loop() for _ in range(concurrency)))
            elapsed = time.perf_counter() - started
            return {
                "rps": done / elapsed,
                "cpu_per_request_us": (time.process_time() - cpu) / done * 1e6,
            }

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--stream", action="store_true", help="100 SSE events per response")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--parts", action="store_true", help="also llm-latency without the loop-lag monitor"
    )
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.worker:
        mode, port = args.worker
        print(json.dumps(work(mode, int(port), args.seconds, args.concurrency, args.stream)))
        return
    rounds, seconds = (1, 1.0) if args.quick else (args.rounds, args.seconds)
    modes = MODES + (tuple(NO_LAG_MODES) if args.parts else ())
    samples: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    with loopback_server() as port:
        for round_no in range(rounds):
            order = modes[round_no % len(modes) :] + modes[: round_no % len(modes)]
            for mode in order:
                out = subprocess.run(
                    [sys.executable, __file__, "--worker", mode, str(port), "--seconds",
                     str(seconds), "--concurrency", str(args.concurrency),
                     *(["--stream"] if args.stream else [])],
                    capture_output=True, text=True, check=True, timeout=600,
                )  # fmt: skip
                samples[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {round_no + 1}/{rounds} done", file=sys.stderr)
    bare = statistics.median(s["rps"] for s in samples["bare"])
    official = statistics.median(s["rps"] for s in samples["otel-contrib"])
    workload = "stream of 100 SSE events" if args.stream else "small JSON completion"
    print(f"aiohttp, {workload}, {args.concurrency} in flight, {seconds:g} s x {rounds} rounds")
    print("| mode | requests/s | ratio to bare | ratio to official | client CPU µs/request |")
    print("|---|---:|---:|---:|---:|")
    for mode in modes:
        rps = statistics.median(s["rps"] for s in samples[mode])
        cpu = statistics.median(s["cpu_per_request_us"] for s in samples[mode])
        print(f"| {mode} | {rps:.0f} | {rps / bare:.2f} | {rps / official:.2f} | {cpu:.0f} |")


if __name__ == "__main__":
    main()
