"""The findings service's memory under sustained traffic: 100,000 calls fed to ``llm-latency
advise``'s state (the :class:`~llm_latency.advise.Advisor` behind its HTTP and gRPC receivers),
in 16 windows (8 services x 2 hosts), and the CPU time of one diagnosis interval over the full
windows.

The calls are real: one burst of the seed's program (30 requests at once through aiohttp's
``TCPConnector(limit_per_host=5)`` against the loopback LLM server of the tests) is recorded with
llm-latency on, and its spans (a request span and its phase spans per call) are replayed with
fresh ids, service names, hosts and times, 1,000 calls a second, through the OTLP protobuf
reader (``spans_of_message``) into ``Advisor.receive``, as an export request of the Collector
reaches it. Traced memory (tracemalloc) is read every 10,000 calls: once the windows are full
(16 x ``--calls-per-window``), it stops growing. It exits 1 when the memory held grew by more
than ``--bytes-per-call`` per call once the windows were full, or when a window holds more than
its bound.

    python bench/advise_soak.py
    python bench/advise_soak.py --total 30000 --calls-per-window 500   # a shorter run
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import sys
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import llm_latency
from llm_latency.advise import Advisor, Settings
from llm_latency.advise.otlp_input import spans_of_message
from llm_latency.diagnosis.records import SpanRecord
from tests.servers import llm_server

SERVICES, HOSTS = 8, 2
SECOND = 1_000_000_000


async def recorded_burst() -> list[SpanRecord]:
    """The spans of one seed burst (30 calls), read back from their OTLP protobuf encoding."""
    provider = TracerProvider(resource=Resource.create({"service.name": "soak"}))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    llm_latency.instrument(
        tracer_provider=provider, meter_provider=MeterProvider(), configure=False
    )
    try:
        async with llm_server() as server:
            connector = aiohttp.TCPConnector(limit_per_host=5)
            async with aiohttp.ClientSession(connector=connector) as session:

                async def one() -> None:
                    async with session.post(server.url(wait=0.05), json={}) as response:
                        await response.read()

                await asyncio.gather(*(one() for _ in range(30)))
    finally:
        llm_latency.uninstrument()
    message = ExportTraceServiceRequest()
    message.ParseFromString(encode_spans(memory.get_finished_spans()).SerializeToString())
    return spans_of_message(message)


def replayed(template: list[SpanRecord], copy: int, calls: int) -> list[SpanRecord]:
    """The template's spans as the ``copy``-th replay: new ids, a service and a host of their
    own, shifted so that calls arrive 1,000 a second."""
    shift = copy * calls * SECOND // 1000
    service = f"service-{copy % SERVICES}"
    host = f"api-{copy // SERVICES % HOSTS}.example"
    spans = []
    for span in template:
        attributes = dict(span.attributes)
        if "server.address" in attributes:
            attributes["server.address"] = host
        spans.append(
            replace(
                span,
                trace_id=f"{copy:08x}{span.trace_id[8:]}",
                span_id=f"{copy:06x}{span.span_id[6:]}",
                parent_id=None if span.parent_id is None else f"{copy:06x}{span.parent_id[6:]}",
                start_ns=span.start_ns + shift,
                end_ns=span.end_ns + shift,
                attributes=attributes,
                service=service,
            )
        )
    return spans


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total", type=int, default=100_000, help="calls in all")
    parser.add_argument("--calls-per-window", type=int, default=2_000)
    parser.add_argument("--checkpoint", type=int, default=10_000, help="read memory every")
    parser.add_argument("--bytes-per-call", type=float, default=20.0, help="memory bound")
    args = parser.parse_args()
    template = asyncio.run(recorded_burst())
    calls = sum(1 for span in template if "url.full" in span.attributes)
    settings = Settings(window=3600.0, per_key=args.calls_per_window, settle=0.0)
    advisor = Advisor(settings)
    origin = min(span.start_ns for span in template)
    traced: dict[int, int] = {}
    gc.collect()
    tracemalloc.start()
    started = time.process_time()
    fed = 0
    copy = 0
    while fed < args.total:
        advisor.receive(replayed(template, copy, calls))
        copy += 1
        fed += calls
        if fed // args.checkpoint != (fed - calls) // args.checkpoint:
            now = origin + fed * SECOND // 1000
            advisor.run_diagnosis(now_ns=now, everything=True)  # reads what settled
            gc.collect()
            traced[fed] = tracemalloc.get_traced_memory()[0]
    feeding = time.process_time() - started
    tracemalloc.stop()  # the diagnosis's CPU time without tracemalloc's own
    now = origin + (fed + 60_000) * SECOND // 1000  # every call complete
    snapshot = advisor.run_diagnosis(now_ns=now)
    held = sum(window.calls for window in snapshot.windows)
    bound = len(snapshot.windows) * args.calls_per_window
    print(f"calls fed:       {fed} ({calls} per recorded burst, {copy} replays)")
    print(f"feeding:         {feeding:.1f} s of CPU ({1e6 * feeding / fed:.0f} µs per call)")
    for number, memory in sorted(traced.items()):
        print(f"traced memory:   {memory / 1e6:7.1f} MB after {number} calls")
    print(f"windows:         {len(snapshot.windows)}, {held} calls held (bound {bound})")
    print(f"per call held:   {traced[max(traced)] / held / 1e3:.1f} kB")
    print(f"dropped:         {snapshot.calls_dropped} calls pushed out by newer ones")
    print(f"diagnosis:       {snapshot.cpu_seconds:.2f} s of CPU for one interval, all windows")
    print(f"findings:        {sorted({a.rule for a in snapshot.advice})}")
    print(f"max RSS:         {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    full = SERVICES * HOSTS * args.calls_per_window
    late = [n for n in sorted(traced) if n >= full + args.checkpoint]
    if len(late) < 2:
        print(f"too few calls past the windows' bound ({full}) to measure a growth")
        return 1
    growth = (traced[late[-1]] - traced[late[0]]) / (late[-1] - late[0])
    print(f"growth:          {growth:.1f} bytes per call from {late[0]} to {late[-1]} calls")
    held_ok = all(window.calls <= args.calls_per_window for window in snapshot.windows)
    return 0 if growth <= args.bytes_per_call and held_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
