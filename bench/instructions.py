"""Instructions per request, counted by valgrind's callgrind: a deterministic second footing for
``overhead.py``'s CPU time.

Subjects: the bare client, the official instrumentation
(``opentelemetry-instrumentation-aiohttp-client``, ``-httpx``, ``-requests``) and llm-latency
(phase spans on, and off), for aiohttp, httpx, httpx2 and requests, with a JSON answer and a
50-event stream. Each is given the providers, as the other benches do; ``llm-latency-default``
is README's quick start instead: ``instrument()`` with no providers, and the same providers set
globally after it (as the program's own set-up, or llm-latency's at the first request, sets
them), so that llm-latency follows them from its first request. The loopback server of ``overhead.py`` runs in its own process, natively; only
the client runs under callgrind.

How a request's cost is counted. Each worker is one interpreter under callgrind, with
``--dump-before=getpgrp``: every ``os.getpgrp()`` of the worker is a checkpoint where callgrind
writes the instructions counted since the previous one (every thread of the process), and
starts again from zero. After a warm-up, the worker makes ``n`` requests, then ``2 n``, each
window ended by a flush of the spans (so that their export, in the span processor's thread, is
in the window of the requests that made them). One request's cost is the difference of the two
windows over ``n``: the difference of two run lengths, with start-up, warm-up and any fixed cost
of a window out of it.

Costs driven by time, not by requests, would be charged to each request many times over under
callgrind's slowdown (about 50 times): a request lasts 50 times longer, so a 10 ms timer fires 50
times more often per request. They are switched off in the request windows and counted apart,
per second of in-flight time:

- the event-loop lag monitor's ticks (llm-latency, asyncio clients; every 10 ms while an attempt
  is in flight): a window that sleeps with the monitor running, less one that sleeps without it,
  over the ticks that ran;
- the periodic metric export (every subject but bare; the SDK's default interval is 60 s): one
  collection and export to a dropping exporter, in a window of its own.

The cyclic collector runs in a worker only at its checkpoints, once each (``gc.disable()``,
then ``gc.collect()`` before each dump): left to its thresholds, a full collection (which walks
every tracked object) falls in one window or the other by where the allocation counts happen to
cross them, which moved a subject's count per request by up to 4 % between runs of the same
tree. So each window pays for collecting the garbage it made, and the walk over what survives,
the same in both request windows, cancels in their difference.

    python bench/instructions.py                          # every client (10 min on 2 idle cores)
    python bench/instructions.py --clients aiohttp --workloads json
    python bench/instructions.py --runs 3                 # three runs, and how far apart
    python bench/instructions.py --requests 200           # JSON windows of 200 and 400 requests
    python bench/instructions.py --cycles                 # and estimated cycles per request

``--cycles`` turns on callgrind's cache and branch simulation and estimates cycles from the
misses, as ``callgrind_annotate`` does: when llm-latency's added instructions missed the caches
or mispredicted branches more (or less) often than the official instrumentation's, the ratio of
cycles moves away from the ratio of instructions, and CPU time would follow the cycles.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from overhead import (
    CLIENTS,
    MODES,
    dropping_providers,
    loopback_server,
    official_instrumentor,
    payload_and_url,
)

#: README's quick start: ``instrument()`` with nothing passed, the providers set after it.
DEFAULT = "llm-latency-default"
#: Every subject measured: ``overhead.py``'s, and the default set-up.
SUBJECTS = (*MODES, DEFAULT)

#: Measurements by client, workload, subject: ``{"request": ..., "export": ..., ...}``.
Results = dict[str, dict[str, dict[str, dict[str, float]]]]

WORKLOADS = {"json": {"n": 30, "warmup": 20}, "stream50": {"n": 15, "warmup": 10}}
#: One sleeping window for the loop-lag monitor's ticks (s of wall time under callgrind).
TICK_WINDOW = 1.0
#: The SDK's default metric export interval (s): the periodic export's cost per second.
METRIC_EXPORT_INTERVAL = 60.0


# -- the worker, under callgrind ----------------------------------------------------------------


def checkpoint() -> None:
    """callgrind writes the instructions counted since the previous checkpoint (see above),
    after one full collection of the garbage the window made (see "The cyclic collector")."""
    gc.collect()
    os.getpgrp()


def _providers() -> tuple[Any, Any]:
    """The SDK as a program sets it up, with what is driven by time switched off: spans leave
    only at a flush (or when a batch is full), metrics only when asked."""
    return dropping_providers(span_delay_millis=1e9, metric_interval_millis=1e9)


def _instrument(client: str, subject: str, tracer_provider: Any, meter_provider: Any) -> None:
    providers = {"tracer_provider": tracer_provider, "meter_provider": meter_provider}
    if subject == "otel-contrib":
        official_instrumentor(client).instrument(**providers)
        return
    import llm_latency
    from llm_latency import lag_monitor

    # The request windows run without the monitor's ticks (counted apart, below): its first
    # timer is never due, and an attempt's own bookkeeping is still counted.
    lag_monitor.INTERVAL_NS = 10**18
    if subject == DEFAULT:
        from opentelemetry import metrics, trace

        llm_latency.instrument(clients=[client])
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
        return
    llm_latency.instrument(
        **providers,
        clients=[client],
        phase_spans=subject == "llm-latency",
        configure=False,
    )


def work(client: str, subject: str, workload: str, port: int) -> dict[str, Any]:
    """Warm-up, then the windows (each ended by a checkpoint); returns the ticks that ran."""
    spec = WORKLOADS[workload]
    tracer_provider, meter_provider = _providers()
    if subject != "bare":
        _instrument(client, subject, tracer_provider, meter_provider)
    payload, url = payload_and_url(workload, port)
    stream = workload != "json"
    done: dict[str, Any] = {}

    def windows(run: Callable[[int], None]) -> None:
        run(spec["warmup"])
        tracer_provider.force_flush()
        checkpoint()  # 1: start-up and warm-up
        run(spec["n"])
        tracer_provider.force_flush()
        checkpoint()  # 2: n requests
        run(2 * spec["n"])
        tracer_provider.force_flush()
        checkpoint()  # 3: 2 n requests
        meter_provider.force_flush()
        checkpoint()  # 4: one metric collection and export

    if client == "requests":
        import requests

        session = requests.Session()

        def run_sync(count: int) -> None:
            for _ in range(count):
                with session.post(url, json=payload, stream=stream) as response:
                    for _ in response.iter_content(None):
                        pass

        windows(run_sync)
        return done

    async def main() -> None:
        if client == "aiohttp":
            import aiohttp

            session: Any = aiohttp.ClientSession()

            async def one() -> None:
                async with session.post(url, json=payload) as response:
                    async for _ in response.content.iter_any():
                        pass
        else:
            session = __import__(client).AsyncClient()

            async def one() -> None:
                async with session.stream("POST", url, json=payload) as response:
                    async for _ in response.aiter_raw():
                        pass

        for count in (spec["warmup"], spec["n"], 2 * spec["n"]):
            await _many(one, count)
            tracer_provider.force_flush()
            checkpoint()
        meter_provider.force_flush()
        checkpoint()
        if subject.startswith("llm-latency"):
            done["ticks"] = await _tick_windows()
        await (session.close() if client == "aiohttp" else session.aclose())

    asyncio.run(main())
    return done


async def _many(one: Callable[[], Any], count: int) -> None:
    for _ in range(count):
        await one()


async def _tick_windows() -> int:
    """Two sleeping windows (checkpoints 5 and 6): without, then with the loop-lag monitor
    running its ticks as it does while an attempt is in flight. Returns the ticks that ran."""
    from llm_latency import lag_monitor

    lag_monitor.INTERVAL_NS = 10_000_000
    await asyncio.sleep(TICK_WINDOW)
    checkpoint()  # 5: a sleep, no monitor
    monitor = lag_monitor.LoopLagMonitor(asyncio.get_running_loop())
    ticks = 0
    tick = monitor._tick

    def counted() -> None:
        nonlocal ticks
        ticks += 1
        tick()

    monitor._tick = counted  # type: ignore[method-assign]
    monitor.attempt_started()
    await asyncio.sleep(TICK_WINDOW)
    checkpoint()  # 6: the same sleep, the monitor ticking
    monitor.stop()
    return ticks


# -- the driver ---------------------------------------------------------------------------------


def callgrind_totals(directory: Path) -> list[dict[str, int]]:
    """The events of each dump of one worker, in order (the part after the last checkpoint, to
    the exit, is left out): ``Ir``, the instructions, and with the cache and branch simulation
    the misses (``D1mr``, ``Bcm``, ...)."""
    numbered = [p for p in directory.iterdir() if p.name.startswith("callgrind.out.")]
    totals = []
    for path in sorted(numbered, key=lambda p: int(p.name.rsplit(".", 1)[1])):
        events: list[str] = []
        for line in path.read_text().splitlines():
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("totals:"):
                totals.append(dict(zip(events, map(int, line.split()[1:]), strict=True)))
                break
    return totals


def estimated_cycles(events: dict[str, int]) -> float:
    """Cycles as ``callgrind_annotate`` estimates them from the simulated misses: an L1 miss
    10, a last-level miss 100, a mispredicted branch 10."""
    l1 = events["I1mr"] + events["D1mr"] + events["D1mw"]
    last_level = events["ILmr"] + events["DLmr"] + events["DLmw"]
    return events["Ir"] + 10 * l1 + 100 * last_level + 10 * (events["Bcm"] + events["Bim"])


def run_worker(
    client: str, subject: str, workload: str, port: int, cycles: bool = False
) -> dict[str, float]:
    """One worker under callgrind; its per-request and time-driven costs (instructions), and
    with ``cycles`` its estimated cycles per request (cache and branch simulation on)."""
    simulate = ["--cache-sim=yes", "--branch-sim=yes"] if cycles else []
    with tempfile.TemporaryDirectory(prefix="llm-latency-callgrind-") as tmp:
        out = subprocess.run(
            [
                "valgrind", "--tool=callgrind", "--dump-before=getpgrp", "--dump-instr=no",
                "--compress-strings=no", "--compress-pos=no", *simulate,
                f"--callgrind-out-file={tmp}/callgrind.out", "--",
                sys.executable, __file__, "--worker", client, subject, workload, str(port),
                str(WORKLOADS[workload]["n"]),
            ],
            capture_output=True, text=True, timeout=3600,
            # String hashes, and so dict and set layouts, the same in every run.
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"{client} {subject} {workload}: {out.stderr[-2000:]}")
        done = json.loads(out.stdout.strip().splitlines()[-1])
        events = callgrind_totals(Path(tmp))
    totals = [dump["Ir"] for dump in events]
    n = WORKLOADS[workload]["n"]
    result = {"request": (totals[2] - totals[1]) / n, "export": float(totals[3])}
    if len(totals) >= 6 and done.get("ticks"):
        result["tick"] = (totals[5] - totals[4]) / done["ticks"]
    if cycles:
        result["cycles"] = (estimated_cycles(events[2]) - estimated_cycles(events[1])) / n
    return result


def measure(
    clients: Sequence[str], workloads: Sequence[str], jobs: int, cycles: bool = False
) -> Results:
    """Every worker once, ``jobs`` at a time; results by client, workload, subject."""
    tasks = [(c, s, w) for c in clients for w in workloads for s in SUBJECTS]
    results: Results = {}
    with loopback_server() as port, concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        futures = {task: pool.submit(run_worker, *task, port, cycles) for task in tasks}
        for (client, subject, workload), future in futures.items():
            cell = results.setdefault(client, {}).setdefault(workload, {})
            cell[subject] = future.result()
    return results


def added(subjects: dict[str, dict[str, float]], subject: str, measure: str = "request") -> float:
    """What ``subject`` adds over the bare client, in ``measure`` (instructions per request by
    default)."""
    return subjects[subject][measure] - subjects["bare"][measure]


def table(results: Results) -> list[str]:
    """Added instructions per request over bare, and the ratio to the official's; the default
    set-up's where it was measured (not in a ``--load`` of a run before it)."""
    lines = [
        "| client | workload | bare k instr | official adds k | llm-latency adds k | ratio "
        "| phase spans off adds k | ratio | default set-up adds k | ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for client, workloads in results.items():
        for workload, subjects in workloads.items():
            bare = subjects["bare"]["request"]
            official = added(subjects, "otel-contrib")
            ours = added(subjects, "llm-latency")
            off = added(subjects, "llm-latency-no-phase-spans")
            default = (
                f"{added(subjects, DEFAULT) / 1e3:,.0f} | {added(subjects, DEFAULT) / official:.2f}"
                if DEFAULT in subjects
                else "- | -"
            )
            lines.append(
                f"| {client} | {workload} | {bare / 1e3:,.0f} | {official / 1e3:,.0f} | "
                f"{ours / 1e3:,.0f} | {ours / official:.2f} | {off / 1e3:,.0f} | "
                f"{off / official:.2f} | {default} |"
            )
    return lines


def cycles_table(results: Results) -> list[str]:
    """What each subject adds in instructions and in estimated cycles, as ratios to the
    official's: whether the added instructions cost alike (the same cache and branch misses
    per instruction)."""
    lines = [
        "| client | workload | subject | adds k instr | ratio | adds k est. cycles | ratio |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for client, workloads in results.items():
        for workload, subjects in workloads.items():
            if "cycles" not in subjects["bare"]:
                continue
            official = added(subjects, "otel-contrib")
            official_cycles = added(subjects, "otel-contrib", "cycles")
            for subject in [s for s in SUBJECTS[1:] if s in subjects]:
                instructions = added(subjects, subject)
                cycles = added(subjects, subject, "cycles")
                lines.append(
                    f"| {client} | {workload} | {subject} | {instructions / 1e3:,.0f} | "
                    f"{instructions / official:.2f} | {cycles / 1e3:,.0f} | "
                    f"{cycles / official_cycles:.2f} |"
                )
    return lines


def time_driven(results: Results) -> list[str]:
    """The costs driven by time, per second of in-flight time."""
    lines = [
        "| client | official: metric export, k instr each (per s) | llm-latency: metric export "
        "(per s) | loop-lag monitor tick, k instr (per s in flight) |",
        "|---|---:|---:|---:|",
    ]
    for client, workloads in results.items():
        subjects = workloads[next(iter(workloads))]
        official = subjects["otel-contrib"]["export"]
        ours = subjects["llm-latency"]["export"]
        tick = subjects["llm-latency"].get("tick")
        ticks = f"{tick / 1e3:,.1f} ({tick * 100 / 1e3:,.0f})" if tick else "- (no loop)"
        lines.append(
            f"| {client} | {official / 1e3:,.0f} ({official / METRIC_EXPORT_INTERVAL / 1e3:,.1f}) "
            f"| {ours / 1e3:,.0f} ({ours / METRIC_EXPORT_INTERVAL / 1e3:,.1f}) | {ticks} |"
        )
    return lines


def side_by_side(
    results: Results,
    cpu: Results,
) -> list[str]:
    """The two measures of what each instrumentation adds per request, and their ratios to the
    official instrumentation's: instructions (callgrind) and CPU time (``overhead.py``'s
    medians: user and system apart)."""
    lines = [
        "| client | workload | subject | adds k instr | ratio | adds CPU µs | ratio "
        "| of which user µs | ratio | system µs |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for client, workloads in results.items():
        for workload, subjects in workloads.items():
            times = cpu.get(client, {}).get(workload)
            if times is None:
                continue
            official = added(subjects, "otel-contrib")
            official_cpu = added(times, "otel-contrib", "cpu_us")
            official_user = added(times, "otel-contrib", "user_us")
            for subject in MODES[1:]:
                instructions = added(subjects, subject)
                added_cpu = added(times, subject, "cpu_us")
                added_user = added(times, subject, "user_us")
                added_system = added(times, subject, "system_us")
                lines.append(
                    f"| {client} | {workload} | {subject} | {instructions / 1e3:,.0f} | "
                    f"{instructions / official:.2f} | {added_cpu:,.1f} | "
                    f"{added_cpu / official_cpu:.2f} | "
                    f"{added_user:,.1f} | {added_user / official_user:.2f} | {added_system:+,.1f} |"
                )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", nargs="+", choices=CLIENTS, default=list(CLIENTS))
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--runs", type=int, default=1, help="repeat, and report the spread")
    parser.add_argument("--jobs", type=int, default=2, help="workers under callgrind at once")
    parser.add_argument(
        "--cycles", action="store_true", help="also estimated cycles (cache and branch simulation)"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--cpu", type=Path, help="overhead.py --json's medians: side by side")
    parser.add_argument("--load", type=Path, help="print the runs of an earlier --json")
    parser.add_argument(
        "--requests",
        type=int,
        default=WORKLOADS["json"]["n"],
        help="n of the JSON workload's windows (default 30): the count per request depends "
        "on it through the cyclic collector (docs/overhead.md), so compare runs at one n",
    )
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    WORKLOADS["json"]["n"] = args.requests
    if args.worker:
        client, subject, workload, port, n = args.worker
        WORKLOADS[workload]["n"] = int(n)
        gc.disable()
        print(json.dumps(work(client, subject, workload, int(port))))
        return
    if args.load:
        runs = json.loads(args.load.read_text())
    elif shutil.which("valgrind") is None:
        sys.exit("bench/instructions.py needs valgrind: apt-get install -y valgrind")
    else:
        runs = [
            measure(args.clients, args.workloads, args.jobs, args.cycles) for _ in range(args.runs)
        ]
    for number, results in enumerate(runs, 1):
        print(f"Instructions per request, run {number} (callgrind):\n")
        print("\n".join(table(results)), end="\n\n")
    if any("cycles" in subjects["bare"] for w in runs[0].values() for subjects in w.values()):
        print("Instructions and estimated cycles (callgrind's cache and branch simulation):\n")
        print("\n".join(cycles_table(runs[0])), end="\n\n")
    print("Driven by time, not by requests:\n")
    print("\n".join(time_driven(runs[0])), end="\n\n")
    if len(runs) > 1:
        print(spread(runs), end="\n\n")
    if args.cpu:
        print("Both measures, side by side (what each subject adds over the bare client):\n")
        print("\n".join(side_by_side(runs[0], json.loads(args.cpu.read_text()))), end="\n\n")
    if args.json and not args.load:
        args.json.write_text(json.dumps(runs, indent=2))


def spread(runs: list[Results]) -> str:
    """The largest spread between runs of any subject's instructions per request, in %."""
    worst = 0.0
    for client, workloads in runs[0].items():
        for workload, subjects in workloads.items():
            for subject in subjects:
                values = [run[client][workload][subject]["request"] for run in runs]
                worst = max(worst, (max(values) - min(values)) / min(values) * 100)
    return f"Largest spread between the {len(runs)} runs, any subject: {worst:.2f} %"


if __name__ == "__main__":
    main()
