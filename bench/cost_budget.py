"""Where llm-latency's CPU per request goes: a cost budget, by part, for each client and workload.

For each client and workload (the JSON completion and the 50-event stream of
``bench/overhead.py``, against its loopback server in its own process):

1. the added CPU per request, measured side by side without a profiler: the bare client and
   llm-latency (phase spans on, metrics on, ``BatchSpanProcessor``), each in a fresh
   interpreter, ``--rounds`` rounds in alternating order, medians;
2. a cProfile run of each of the two, in fresh interpreters again. The profiled llm-latency run
   is split into parts by the functions that do each job (below);
3. each part's share of all the parts, applied to the added CPU of step 1 (a profiler slows
   small functions more than large ones: the shares are estimates, the total is not). The
   difference of the two profiled totals is printed too; it is noisy (two runs), so it is not
   used to scale.

Parts:

- hooks: the adapters' wrappers and hook functions (their own time, and the OpenTelemetry API
  calls they make: ``traceparent`` injection, context);
- Timeline: recording phase boundaries;
- request span start: ``Emitter.start`` and ``RequestStart.start`` (span creation, attributes
  known at the start, the attempt counted in flight);
- request span end: ending the span and its status, and the rest of ending an attempt;
- facts: what the finished Timeline says (headers selected and parsed, server time, overhead,
  lag, stream facts, error type);
- attributes: naming those facts as the request span's attributes, and setting them;
- phase spans: one finished span per phase;
- metric records: every histogram and counter record, exemplars included (and, of those, the
  exemplar sampling alone);
- stream counting: SSE parsing and chunk timing;
- logical calls: attempt numbering and backoffs of a call;
- event-loop lag monitor: its ticks and its per-attempt bookkeeping.

    python bench/cost_budget.py                    # every client, about 3 minutes on 2 cores
    python bench/cost_budget.py --clients aiohttp
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import overhead

Key = tuple[str, int, str]  # (file, line, function), as pstats names a function
PROFILED_REQUESTS = {"json": 1500, "stream50": 300}

SRC = f"{os.sep}llm_latency{os.sep}"
OTEL = f"{os.sep}opentelemetry{os.sep}"


def _in(key: Key, *parts: str) -> bool:
    return SRC in key[0] and any(key[0].endswith(part) for part in parts)


def _named(key: Key, module: str, *functions: str) -> bool:
    return _in(key, module) and key[2] in functions


class Profile:
    """A pstats table with the questions the budget asks of it."""

    def __init__(self, path: str) -> None:
        self.stats: dict[Key, Any] = pstats.Stats(path).stats  # type: ignore[attr-defined]

    def total(self) -> float:
        return sum(entry[2] for entry in self.stats.values())

    def own(self, chosen: Callable[[Key], bool]) -> float:
        """Own (exclusive) time of the chosen functions."""
        return sum(entry[2] for key, entry in self.stats.items() if chosen(key))

    def inclusive(self, chosen: Callable[[Key], bool]) -> float:
        """Inclusive time of the chosen functions, counted once: calls among them are not added
        again (their time is in their callers' already)."""
        time_ = 0.0
        for key, (_, _, _, _, callers) in self.stats.items():
            if not chosen(key):
                continue
            for caller, edge in callers.items():
                if not chosen(caller):
                    time_ += edge[3]
        return time_

    def calls_from(
        self, caller_chosen: Callable[[Key], bool], callee_chosen: Callable[[Key], bool]
    ) -> float:
        """Inclusive time of calls from the chosen callers into the chosen callees."""
        time_ = 0.0
        for key, (_, _, _, _, callers) in self.stats.items():
            if not callee_chosen(key):
                continue
            for caller, edge in callers.items():
                if caller_chosen(caller):
                    time_ += edge[3]
        return time_


ADAPTERS = (
    "_patching.py",
    "_hooks.py",
    "_wrappers.py",
    "aiohttp.py",
    "_aiohttp_attempt.py",
    "_aiohttp_connection.py",
    "httpcore.py",
    "_httpcore_trace.py",
    "requests.py",
    "_resolver.py",
    "sdks.py",
)


def is_hook(key: Key) -> bool:
    return f"{SRC}adapters{os.sep}" in key[0] and _in(key, *ADAPTERS)


def is_otel(key: Key) -> bool:
    return OTEL in key[0]


def is_timeline(key: Key) -> bool:
    return _in(key, "timeline.py") and key[2] != "chunk"


def is_stream(key: Key) -> bool:
    return _in(key, "sse.py") or _named(key, "timeline.py", "chunk")


def is_start(key: Key) -> bool:
    return (
        _named(key, "emitter.py", "start")
        or _named(key, "in_flight.py", "add")
        or _in(key, "request_start.py", "attempt_record.py", "tracer_handle.py")
    )


def is_calls(key: Key) -> bool:
    return _in(key, "calls.py", "call_spans.py", "retry.py") or _named(
        key, "emitter.py", "_attempt_ends"
    )


def is_lag(key: Key) -> bool:
    return _in(key, "event_loop.py", "lag_monitor.py")


def is_phases(key: Key) -> bool:
    return _named(key, "span_writer.py", "_phases")


def is_phase_record(key: Key) -> bool:
    return _named(key, "metrics.py", "phase")


def is_metrics(key: Key) -> bool:
    return _named(key, "metrics.py", "record") or is_phase_record(key)


def is_facts(key: Key) -> bool:
    return _named(key, "facts.py", "read_facts")


def is_attributes(key: Key) -> bool:
    return _in(key, "attribute_table.py")


def is_emit(key: Key) -> bool:
    return _named(key, "emitter.py", "_emit") or _named(key, "span_writer.py", "write")


def is_finish(key: Key) -> bool:
    return _named(key, "emitter.py", "finish", "finish_failed") or _named(
        key, "in_flight.py", "take", "charge_loop_lag"
    )


def is_exemplar(key: Key) -> bool:
    return is_otel(key) and key[2] == "_sample_exemplar"


def is_set_attributes(key: Key) -> bool:
    return is_otel(key) and key[2] == "set_attributes"


def is_emitted_elsewhere(key: Key) -> bool:
    return is_phases(key) or is_metrics(key) or is_calls(key) or is_facts(key)


def budget(profile: Profile) -> dict[str, float]:
    """Profiled seconds per part of the llm-latency run."""
    parts: dict[str, float] = {}
    parts["hooks"] = profile.own(is_hook) + profile.calls_from(is_hook, is_otel)
    parts["Timeline"] = profile.own(is_timeline)
    parts["stream counting"] = profile.inclusive(is_stream)
    parts["logical calls"] = profile.inclusive(is_calls)
    parts["event-loop lag monitor"] = profile.inclusive(is_lag)
    parts["request span start"] = profile.inclusive(is_start) - profile.calls_from(
        is_start, is_calls
    )
    parts["phase spans"] = profile.inclusive(is_phases) - profile.calls_from(
        is_phases, is_phase_record
    )
    parts["metric records"] = profile.inclusive(is_metrics)
    parts["  of which exemplars"] = profile.inclusive(is_exemplar)
    parts["facts"] = profile.inclusive(is_facts)
    parts["attributes"] = profile.calls_from(is_emit, is_set_attributes) + profile.inclusive(
        is_attributes
    )
    emit = profile.inclusive(is_emit)
    finish_own = profile.inclusive(is_finish) - emit - profile.calls_from(is_finish, is_lag)
    parts["request span end"] = (
        emit
        - profile.calls_from(is_emit, is_emitted_elsewhere)
        - parts["attributes"]
        + max(finish_own, 0.0)
    )
    return parts


# -- workers ---------------------------------------------------------------------------------


def profiled_worker(client: str, mode: str, workload: str, port: int, out: str) -> None:
    """One profiled run: warm up (imports, instrumentation), then profile only the requests."""
    spec = overhead.WORKLOADS[workload]
    spec["requests"] = 50
    overhead.work(client, mode, workload, port)
    spec["requests"] = PROFILED_REQUESTS[workload]
    spec["warmup"] = 0
    overhead._instrument = lambda c, m: None  # type: ignore[assignment]  # already done
    profiler = cProfile.Profile()
    profiler.enable()
    result = overhead.work(client, mode, workload, port)
    profiler.disable()
    profiler.dump_stats(out)
    print(json.dumps(result))


def _run(args: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=True, timeout=900
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def measure(clients: Iterable[str], rounds: int, port: int) -> None:
    for client in clients:
        for workload in overhead.WORKLOADS:
            cpu: dict[str, list[float]] = {"bare": [], "llm-latency": []}
            for round_no in range(rounds):
                order = ["bare", "llm-latency"] if round_no % 2 == 0 else ["llm-latency", "bare"]
                for mode in order:
                    cpu[mode].append(overhead.run_worker(client, mode, workload, port)["cpu_us"])
            added = statistics.median(cpu["llm-latency"]) - statistics.median(cpu["bare"])
            with tempfile.TemporaryDirectory() as tmp:
                totals = {}
                for mode in ("bare", "llm-latency"):
                    path = f"{tmp}/{mode}.prof"
                    _run(["--profiled", client, mode, workload, str(port), path])
                    totals[mode] = Profile(path)
                n = PROFILED_REQUESTS[workload]
                profiled_added = (totals["llm-latency"].total() - totals["bare"].total()) / n
                parts = {k: v / n for k, v in budget(totals["llm-latency"]).items()}
            report(client, workload, added, profiled_added, parts)


def report(
    client: str, workload: str, added_us: float, profiled_added: float, parts: dict[str, float]
) -> None:
    """The budget of one client and workload: each part under the profiler, its share of all
    the parts, and that share of the unprofiled added CPU."""
    claimed = sum(v for k, v in parts.items() if not k.startswith(" ")) or 1e-12
    print(
        f"\n{client}, {workload}: {added_us:.0f} µs of CPU added per request (unprofiled, "
        f"median); under cProfile {profiled_added * 1e6:.0f} µs, of which the parts below "
        f"claim {claimed * 1e6:.0f} µs"
    )
    print("| part | µs under cProfile | share of the parts | ≈ µs unprofiled |")
    print("|---|---:|---:|---:|")
    ordered = sorted(parts.items(), key=lambda kv: -kv[1])
    for name, seconds in [kv for kv in ordered if not kv[0].startswith(" ")] + [
        kv for kv in ordered if kv[0].startswith(" ")
    ]:
        share = seconds / claimed
        print(f"| {name} | {seconds * 1e6:.1f} | {share * 100:.0f}% | {share * added_us:.1f} |")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--clients", nargs="+", choices=overhead.CLIENTS, default=list(overhead.CLIENTS)
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profiled", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.profiled:
        client, mode, workload, port, out = args.profiled
        profiled_worker(client, mode, workload, int(port), out)
        return
    with overhead.loopback_server() as port:
        measure(args.clients, args.rounds, port)


if __name__ == "__main__":
    main()
