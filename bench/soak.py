"""The full-size long run: 50,000 sequential aiohttp requests with llm-latency on, against the
loopback LLM server of the tests (100 to 210 s on 2 cores, as busy as they are). It checks what
``tests/test_load.py::test_long_run_memory_is_flat_and_nothing_is_dropped`` checks on 5,000
requests, with a 20 times tighter memory bound: traced memory grows by less than 50 bytes per
request over the last 40,000, no Timeline is left alive, every span and every request duration
is exported. It prints the measurements and exits 1 when something does not hold.

    python bench/soak.py
    python bench/soak.py --total 20000 --checkpoint 6000   # a shorter run
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.long_run import long_run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total", type=int, default=50_000, help="requests in all")
    parser.add_argument("--warmup", type=int, default=2_000, help="requests before tracemalloc")
    parser.add_argument("--checkpoint", type=int, default=10_000, help="first memory reading")
    parser.add_argument("--bytes-per-request", type=float, default=50.0, help="memory bound")
    args = parser.parse_args()
    started = time.perf_counter()
    run = asyncio.run(long_run(args.total, args.warmup, args.checkpoint))
    elapsed = time.perf_counter() - started
    measured = run.total - run.checkpoint
    print(
        f"requests:        {run.total} in {elapsed:.1f} s ({1000 * elapsed / run.total:.2f} ms each)"
    )
    for number, traced in sorted(run.traced.items()):
        print(f"traced memory:   {traced / 1e6:.3f} MB after {number} requests")
    print(
        f"growth:          {run.growth / 1e3:.1f} kB over the last {measured} requests "
        f"({run.growth / measured:.1f} B each; bound {args.bytes_per_request:g} B)"
    )
    print(f"Timelines alive: {run.timelines_left}")
    print(
        f"spans exported:  {run.exported_count} ({', '.join(f'{k}: {v}' for k, v in sorted(run.exported.items()))})"
    )
    print(f"durations:       {run.duration_points} recorded")
    problems = run.problems(args.bytes_per_request)
    for problem in problems:
        print(f"FAILED: {problem}")
    print("FAILED" if problems else "OK")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
