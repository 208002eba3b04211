"""The event-loop lag monitor: what it costs, and how well it takes the program's stall out.

1. Cost, side by side in one run: the CPU an idle event loop uses for 3 s with and without an
   attempt in flight (the monitor ticks every 10 ms only while one is), and the CPU of one
   attempt's start and end on the monitor.
2. Accuracy: 50 aiohttp requests in flight against ``llm-latency mock-server`` in its own process
   (0.3 s to the first byte; openai-processing-ms reports the time it really spent), once with
   an idle loop and once with the loop blocked for 0.55 s once all requests are out. For each: the wait phase,
   the lag charged, the send-to-first-byte window less the lag (which should be the server's
   0.3 s), the server's reported time and the network overhead left.

    python bench/event_loop_lag.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp

from llm_latency.lag_monitor import LoopLagMonitor
from tests.conftest import Telemetry
from tests.test_cli import mock_server
from tests.test_event_loop_lag import BLOCK, SentRequests, burst, facts

SECONDS = 3.0
PAIRS = 200_000


async def idle_cpu(in_flight: bool) -> float:
    """CPU seconds of an idle loop over SECONDS, with the monitor ticking or not."""
    monitor = LoopLagMonitor(asyncio.get_running_loop())
    if in_flight:
        monitor.attempt_started()
    start = time.process_time()
    await asyncio.sleep(SECONDS)
    used = time.process_time() - start
    if in_flight:
        monitor.phase_delays(lambda phase: None, 1)
    monitor.stop()
    return used


async def bare_timer_cpu() -> float:
    """CPU seconds of an idle loop over SECONDS that only re-arms a 10 ms timer: what any
    wakeup costs on this machine, the floor of the monitor's tick."""
    loop = asyncio.get_running_loop()
    handle: asyncio.TimerHandle | None = None

    def tick() -> None:
        nonlocal handle
        handle = loop.call_later(0.01, tick)

    handle = loop.call_later(0.01, tick)
    start = time.process_time()
    await asyncio.sleep(SECONDS)
    used = time.process_time() - start
    handle.cancel()
    return used


async def pair_cost() -> float:
    """CPU seconds of one attempt's start and end on a monitor already ticking."""
    monitor = LoopLagMonitor(asyncio.get_running_loop())
    monitor.attempt_started()
    windows = [(1, 2), (2, 3)]
    start = time.process_time()
    for _ in range(PAIRS):
        monitor.attempt_started()
        monitor.phase_delays(windows.__getitem__, len(windows))
    used = time.process_time() - start
    monitor.stop()
    return used / PAIRS


async def accuracy(url: str, blocked: bool) -> str:
    telemetry = Telemetry()
    telemetry.instrument()
    try:
        sent = SentRequests()
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(
            connector=connector, trace_configs=[sent.config]
        ) as session:
            async with session.post(url, json={}) as response:
                await response.read()
            telemetry.exporter.clear()
            await burst(session, url, sent if blocked else None)
    finally:
        import llm_latency

        llm_latency.uninstrument()
    rows = facts(telemetry)
    wait = statistics.median(r["wait"] for r in rows)
    lag = statistics.median(r["llm_latency.event_loop.lag"] for r in rows)
    left = sorted(r["window"] - r["llm_latency.event_loop.lag"] for r in rows)
    server = statistics.median(r["llm_latency.server.processing_time"] for r in rows)
    overhead = statistics.median(r["llm_latency.network_overhead"] for r in rows)
    return (
        f"{f'blocked {BLOCK:g} s' if blocked else 'idle loop':<14} wait p50 {wait * 1000:6.1f} ms"
        f"  lag p50 {lag * 1000:6.1f} ms  window-lag min/p50/max {left[0] * 1000:.1f}/"
        f"{statistics.median(left) * 1000:.1f}/{left[-1] * 1000:.1f} ms"
        f"  server p50 {server * 1000:.0f} ms  overhead p50 {overhead * 1000:.1f} ms"
    )


async def main() -> None:
    without = await idle_cpu(False)
    with_monitor = await idle_cpu(True)
    bare = await bare_timer_cpu()
    ticks = SECONDS / 0.01
    print(f"idle loop, {SECONDS:g} s: CPU {without * 1000:.1f} ms without an attempt in flight, "
          f"{with_monitor * 1000:.1f} ms with one ({ticks:.0f} ticks): "
          f"{(with_monitor - without) / ticks * 1e6:.1f} us per tick, "
          f"{(with_monitor - without) / SECONDS * 100:.3f} % of a core; a bare 10 ms timer: "
          f"{(bare - without) / ticks * 1e6:.1f} us per wakeup")  # fmt: skip
    print(f"one attempt's start and end on the monitor: {await pair_cost() * 1e6:.2f} us")
    with mock_server("--ttfb", "0.3", "--tokens", "1", "--tokens-per-second", "1000") as mock:
        for blocked in (False, True):
            print(await accuracy(mock.url, blocked))


if __name__ == "__main__":
    asyncio.run(main())
