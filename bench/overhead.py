"""What llm-latency costs per request, side by side with the official instrumentations.

Runs a loopback server in its own process, then, for several rounds, each client and mode in a
fresh interpreter. Clients: aiohttp, httpx and httpx2 (async clients), requests. Modes: bare;
with the official instrumentation (``opentelemetry-instrumentation-aiohttp-client``,
``-httpx`` with its ``HTTPXClientInstrumentor`` / ``HTTPX2ClientInstrumentor``, ``-requests``);
with llm-latency (phase spans on, and off). Every instrumented mode exports through the SDK's
``BatchSpanProcessor`` to an exporter that drops spans, with metrics on (a periodic reader with
a dropping exporter). Each worker makes sequential requests on one pooled client and reports its
process CPU time and wall time per request; the tables give medians over rounds and the cost
each mode adds over the bare client.

    python bench/overhead.py                      # every client (about 4 minutes on 2 cores)
    python bench/overhead.py --clients aiohttp    # one client
    python bench/overhead.py --quick              # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

CLIENTS = ("aiohttp", "httpx", "httpx2", "requests")
MODES = ("bare", "otel-contrib", "llm-latency", "llm-latency-no-phase-spans")
WORKLOADS = {"json": {"requests": 400, "warmup": 50}, "stream50": {"requests": 120, "warmup": 10}}
EVENTS = 50


# -- the server ---------------------------------------------------------------------------------


def serve(port_file: str) -> None:
    from aiohttp import web

    # An OpenAI chat completion as the API sends it: the model first, the usage last; a stream
    # of deltas ending with the include_usage chunk and [DONE].
    usage = {"prompt_tokens": 12, "completion_tokens": 50, "total_tokens": 62}
    body = json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "gpt-bench",
            "choices": [{"message": {"role": "assistant", "content": "hi" * 50}}],
            "usage": usage,
        }
    )
    event = b'data: {"model": "gpt-bench", "choices": [{"delta": {"content": "tok"}}]}\n\n'
    last = f"data: {json.dumps({'model': 'gpt-bench', 'choices': [], 'usage': usage})}\n\n"
    headers = {"x-request-id": "req_1", "openai-processing-ms": "1",
               "x-ratelimit-remaining-requests": "99"}  # fmt: skip

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        if request.query.get("stream") != "1":
            return web.Response(text=body, content_type="application/json", headers=headers)
        response = web.StreamResponse(headers=headers)
        response.content_type = "text/event-stream"
        await response.prepare(request)
        for _ in range(EVENTS):
            await response.write(event)
            await asyncio.sleep(0)
        await response.write(last.encode() + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        Path(port_file).write_text(str(port))
        await asyncio.Event().wait()

    asyncio.run(main())


# -- a worker: one mode, one workload, in a fresh interpreter ----------------------------------


@contextlib.contextmanager
def loopback_server() -> Iterator[int]:
    """The bench's loopback server (:func:`serve`) in a process of its own; yields its port."""
    port_file = Path(f"/tmp/llm-latency-bench-{os.getpid()}-{time.monotonic_ns()}.port")
    server = subprocess.Popen([sys.executable, str(Path(__file__)), "--serve", str(port_file)])
    try:
        for _ in range(600):  # 30 s: a loaded machine starts an interpreter slowly
            if port_file.exists() and port_file.read_text():
                break
            time.sleep(0.05)
        yield int(port_file.read_text())
    finally:
        server.terminate()
        server.wait()
        port_file.unlink(missing_ok=True)


def dropping_providers(
    span_delay_millis: float = 5000, metric_interval_millis: float = 1000
) -> tuple[Any, Any]:
    """A tracer and a meter provider as a program sets them up (batch span processor, periodic
    metric reader), whose exporters drop what they get."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        MetricExporter,
        MetricExportResult,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class DropSpans(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    class DropMetrics(MetricExporter):
        def export(self, metrics_data: Any, timeout_millis: float = 0, **kw: Any) -> Any:
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 0) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 0, **kwargs: Any) -> None:
            return None

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(
        BatchSpanProcessor(DropSpans(), schedule_delay_millis=span_delay_millis)
    )
    reader = PeriodicExportingMetricReader(
        DropMetrics(), export_interval_millis=metric_interval_millis
    )
    return tracer_provider, MeterProvider(metric_readers=[reader])


def official_instrumentor(client: str) -> Any:
    """The official OpenTelemetry instrumentation of ``client``, not yet instrumenting."""
    if client == "aiohttp":
        from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor

        return AioHttpClientInstrumentor()
    if client == "httpx":
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

        return HTTPXClientInstrumentor()
    if client == "httpx2":
        from opentelemetry.instrumentation.httpx import HTTPX2ClientInstrumentor

        return HTTPX2ClientInstrumentor()
    from opentelemetry.instrumentation.requests import RequestsInstrumentor

    return RequestsInstrumentor()


def _instrument(client: str, mode: str) -> Callable[[], object]:
    """Instrument for ``mode``; returns the flush of the spans."""
    tracer_provider, meter_provider = dropping_providers()
    providers = {
        "tracer_provider": tracer_provider,
        "meter_provider": meter_provider,
    }
    if mode == "otel-contrib":
        official_instrumentor(client).instrument(**providers)
        return tracer_provider.force_flush
    import llm_latency

    llm_latency.instrument(
        **providers,  # type: ignore[arg-type]
        clients=[client],
        phase_spans=mode == "llm-latency",
        configure=False,
    )
    return tracer_provider.force_flush


def _cpu() -> tuple[float, float, float]:
    """User and system CPU time of the process (every thread, to the microsecond: ``os.times``
    counts in clock ticks of 10 ms), and the wall clock."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime, time.perf_counter()


def payload_and_url(workload: str, port: int) -> tuple[dict[str, Any], str]:
    """The request body and URL of a workload on the server of :func:`serve`."""
    stream = workload.startswith("stream")
    url = f"http://127.0.0.1:{port}/v1/chat/completions" + ("?stream=1" if stream else "")
    return {"model": "m", "messages": [{"role": "user", "content": "hello"}], "stream": stream}, url


def work(client: str, mode: str, workload: str, port: int) -> dict[str, Any]:
    # The spans' export (the span processor's thread) is counted in the window that made them.
    flush = _instrument(client, mode) if mode != "bare" else None
    spec = WORKLOADS[workload]
    stream = workload.startswith("stream")
    payload, url = payload_and_url(workload, port)
    chunks = 0

    if client == "requests":
        import requests

        session = requests.Session()

        def one_sync() -> None:
            nonlocal chunks
            with session.post(url, json=payload, stream=stream) as response:
                if stream:
                    for _ in response.iter_content(None):
                        chunks += 1
                else:
                    response.content  # noqa: B018

        for _ in range(spec["warmup"]):
            one_sync()
        chunks = 0
        start = _cpu()
        for _ in range(spec["requests"]):
            one_sync()
        if flush:
            flush()
        end = _cpu()
    else:

        async def main() -> tuple[tuple[float, float, float], tuple[float, float, float]]:
            nonlocal chunks
            if client == "aiohttp":
                import aiohttp

                session: Any = aiohttp.ClientSession()

                async def one() -> None:
                    nonlocal chunks
                    async with session.post(url, json=payload) as response:
                        if stream:
                            async for _ in response.content.iter_any():
                                chunks += 1
                        else:
                            await response.read()
            else:
                module: Any = __import__(client)
                session = module.AsyncClient()

                async def one() -> None:
                    nonlocal chunks
                    async with session.stream("POST", url, json=payload) as response:
                        async for _ in response.aiter_raw():
                            chunks += 1 if stream else 0

            for _ in range(spec["warmup"]):
                await one()
            chunks = 0
            start = _cpu()
            for _ in range(spec["requests"]):
                await one()
            if flush:
                flush()
            result = start, _cpu()
            await (session.close() if client == "aiohttp" else session.aclose())
            return result

        start, end = asyncio.run(main())
    n = spec["requests"]
    user, system, wall = (b - a for a, b in zip(start, end, strict=True))
    return {
        "cpu_us": (user + system) / n * 1e6,
        "user_us": user / n * 1e6,
        "system_us": system / n * 1e6,
        "wall_us": wall / n * 1e6,
        "chunks": chunks / n,
    }


# -- the driver ---------------------------------------------------------------------------------


def run_worker(client: str, mode: str, workload: str, port: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", client, mode, workload, str(port)],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one round, fewer requests")
    parser.add_argument("--clients", nargs="+", choices=CLIENTS, default=list(CLIENTS))
    parser.add_argument("--json", type=Path, help="also write the medians here")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.worker:
        client, mode, workload, port = args.worker
        if os.environ.get("BENCH_QUICK"):
            for spec in WORKLOADS.values():
                spec["requests"] //= 8
                spec["warmup"] //= 5
        print(json.dumps(work(client, mode, workload, int(port))))
        return

    rounds = 1 if args.quick else args.rounds
    if args.quick:
        os.environ["BENCH_QUICK"] = "1"
    with loopback_server() as port:
        samples: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        for round_no in range(rounds):
            for client in args.clients:
                for workload in WORKLOADS:
                    # Rotate the order each round so no mode always runs first.
                    order = MODES[round_no % len(MODES) :] + MODES[: round_no % len(MODES)]
                    for mode in order:
                        samples.setdefault((client, workload, mode), []).append(
                            run_worker(client, mode, workload, port)
                        )
            print(f"round {round_no + 1}/{rounds} done", file=sys.stderr)
    report(samples, args.json)


def report(
    samples: dict[tuple[str, str, str], list[dict[str, Any]]], json_path: Path | None
) -> None:
    medians: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for (client, workload, mode), runs in samples.items():
        cell = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        # The rounds' spread, for the JSON (how far a median can be trusted).
        cell.update({f"{key}_rounds": [run[key] for run in runs] for key in runs[0]})  # type: ignore[misc]
        medians.setdefault(client, {}).setdefault(workload, {})[mode] = cell
    print(
        "| client | workload | mode | CPU µs/request | added CPU µs | added user µs "
        "| added system µs | wall µs/request | added wall µs |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for client, workloads in medians.items():
        for workload, modes in workloads.items():
            bare = modes["bare"]
            for mode in MODES:
                m = modes[mode]
                print(
                    f"| {client} | {workload} | {mode} | {m['cpu_us']:.1f} | "
                    f"{m['cpu_us'] - bare['cpu_us']:+.1f} | "
                    f"{m.get('user_us', 0) - bare.get('user_us', 0):+.1f} | "
                    f"{m.get('system_us', 0) - bare.get('system_us', 0):+.1f} | "
                    f"{m['wall_us']:.1f} | {m['wall_us'] - bare['wall_us']:+.1f} |"
                )
    print()
    print("Added CPU relative to the official instrumentation's (1.00 = the same cost):")
    print()
    print(
        "| client | workload | llm-latency | llm-latency, phase spans off | chunks/request | added µs per chunk |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for client, workloads in medians.items():
        plain = workloads.get("json")
        for workload, modes in workloads.items():
            bare = modes["bare"]["cpu_us"]
            official = modes["otel-contrib"]["cpu_us"] - bare
            ours = modes["llm-latency"]["cpu_us"] - bare
            off = modes["llm-latency-no-phase-spans"]["cpu_us"] - bare
            per_chunk = "-"
            chunks = modes["llm-latency"]["chunks"]
            if workload != "json" and plain and chunks:
                per_request = plain["llm-latency"]["cpu_us"] - plain["bare"]["cpu_us"]
                per_chunk = f"{(ours - per_request) / chunks:.2f}"
            print(
                f"| {client} | {workload} | {ours / official:.2f} | {off / official:.2f} | "
                f"{chunks:.0f} | {per_chunk} |"
            )
    if json_path:
        json_path.write_text(json.dumps(medians, indent=2))


if __name__ == "__main__":
    main()
