"""llm-latency's phases against ``curl -w`` on the same TLS server, idle and under CPU load.

``llm-latency mock-server --tls --tls-delay D --ttfb T --tokens 1`` runs in its own process
(each handshake is held ``D`` seconds; the first byte comes ``T`` seconds after the request,
plus one token's generation, 20 ms). Against it, ``--requests`` interleaved rounds (the order
rotates each round) each make one request per client, every one on a fresh connection: a
``curl`` process (``--http1.1 --cacert CA``, a POST of a small JSON body to
``/v1/chat/completions``, phases from ``-w``) and one request per instrumented client on a
fresh client object (httpx, async httpx, aiohttp, requests), phases read from the exported
spans (``InMemorySpanExporter``, as ``tests/conftest.py``'s ``Telemetry``). Two more clients
on request: ``curl2``, a second curl series against the first (how far two series of the same
client drift apart at that load: the noise floor), and ``httpx-process``, instrumented httpx
in a fresh Python process per request, as curl is.

Compared per phase:

- connect: curl ``time_connect - time_namelookup``; ``http.connect``;
- tls: ``time_appconnect - time_connect``; ``http.tls``;
- first byte: ``time_starttransfer - time_pretransfer``; ``http.send`` + ``http.wait``;
- total: ``time_total``; the request span.

For each client, phase and condition: the medians, their difference, and the largest absolute
difference of matched percentiles (p10, p25, p50, p75, p90). Conditions: ``--burners`` lists
how many CPU burner processes (``sh -c 'while :; do :; done'``) run during each (started
before it, stopped after it). Other work on the machine (a CI run) adds to the burners, so
each condition is printed with the load average (1 and 5 min, at its end), the machine's CPU
busy share over it, and the mean number of runnable tasks, sampled before each request
(``procs_running`` of ``/proc/stat``, this process included).

Where the differences come from:

- run-queue wait (``/proc/.../schedstat``: runnable, not running): of each curl process over
  its life, read once it has exited and before it is reaped; of the client's thread over each
  in-process request;
- where the phase ends' timestamps are taken (``--no-trace`` turns this off): for the async
  clients the event loop's selector and ``ssl.SSLObject.do_handshake`` are wrapped, for sync
  httpx httpcore's ``SyncBackend.connect_tcp``, ``SyncStream.start_tls`` and ``SyncStream.read``;
  each logs when a call returned with something (I/O events, a socket, data, a finished
  handshake) and the thread's run-queue wait during the call (mostly after its wake-up). For
  each phase end (connect, tls, wait) the bench prints the time from the last such return to
  the end's timestamp (the client's own work between the syscall and the hook, in asyncio
  through the loop's callbacks and a task's resumption) and that call's run-queue wait (the
  wake-up delay, which curl, waiting in ``poll``, has too).

The numbers, and what they are made of: docs/accuracy.md, "Against curl".

    python bench/against_curl.py                       # idle, then 2 burners: about 1.5 minutes
    python bench/against_curl.py --burners 0,1,2,4 --clients curl2,httpx,httpx-async,aiohttp
    python bench/against_curl.py --requests 20 --clients httpx,httpx-process
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import selectors
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpcore._backends.sync
import httpx
import requests
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import llm_latency

CLI = str(Path(sys.executable).with_name("llm-latency"))
BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
PHASES = ("connect", "tls", "first byte", "total")
ENDS = ("connect", "tls", "wait")  # the phase ends whose timestamps are traced
PERCENTILES = (10, 25, 50, 75, 90)
CLIENTS = ("httpx", "httpx-async", "aiohttp", "requests")
EXTRA_CLIENTS = ("curl2", "httpx-process")
TRACED = ("httpx", "httpx-async", "aiohttp")
CURL_FORMAT = (
    "%{time_namelookup} %{time_connect} %{time_appconnect} "
    "%{time_pretransfer} %{time_starttransfer} %{time_total} %{http_code}"
)
SCHEDSTAT = "/proc/thread-self/schedstat"
DESCHEDULED = "llm_latency.event_loop.descheduled"
ASYNC = ("httpx-async", "aiohttp")

Phases = dict[str, float]  # phase -> seconds


@dataclass
class Server:
    url: str
    ca_file: str


@dataclass
class Sample:
    """One request: its phases (s); its run-queue wait (s: a curl or child process's over its
    life, the client thread's over an in-process request); per traced phase end, the time from
    the last I/O return before it, and that I/O call's run-queue wait (s)."""

    phases: Phases
    run_queue: float = 0.0
    #: The request span's ``llm_latency.event_loop.descheduled`` (async clients; s), if set.
    descheduled: float = 0.0
    after_io: dict[str, float] = field(default_factory=dict)
    queued: dict[str, float] = field(default_factory=dict)


# -- the server and the load ---------------------------------------------------------------------


@contextlib.contextmanager
def mock_server(tls_delay: float, ttfb: float) -> Iterator[Server]:
    """``llm-latency mock-server --tls`` on a free port, in its own process (as
    ``tests/command_line.py``'s ``mock_server``); stopped at the end."""
    process = subprocess.Popen(
        [CLI, "mock-server", "--port", "0", "--tls", "--tls-delay", str(tls_delay),
         "--ttfb", str(ttfb), "--tokens", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if "listening on " not in line:
            raise RuntimeError(line + (process.stderr.read() if process.stderr else ""))
        url = line.split("listening on ", 1)[1].strip()
        ca_file = process.stdout.readline().split("CA certificate: ", 1)[1].strip()
        yield Server(url, ca_file)
    finally:
        process.terminate()
        process.wait(timeout=10)


@contextlib.contextmanager
def burners(count: int) -> Iterator[None]:
    """``count`` CPU burner processes (``while :; do :; done``), stopped at the end."""
    started = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(count)]
    try:
        time.sleep(1.0 if count else 0.0)  # let the scheduler and the load average see them
        yield
    finally:
        for process in started:
            process.terminate()
        for process in started:
            process.wait(timeout=10)


def runnable() -> int:
    """Tasks running or runnable on the machine now (``procs_running`` of /proc/stat)."""
    with open("/proc/stat") as stat:
        for line in stat:
            if line.startswith("procs_running "):
                return int(line.split()[1])
    return 0


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs, from /proc/stat."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return sum(values) - idle, sum(values)


# -- run-queue waits and where timestamps are taken ----------------------------------------------


@dataclass
class IoReturn:
    """One traced call: when it returned (perf_counter ns) and the run-queue wait during it."""

    returned_ns: int
    queued_ns: int


class IoLog:
    """The traced calls of the request in flight (one at a time, in the main thread)."""

    def __init__(self) -> None:
        self.returns: list[IoReturn] = []
        try:
            self._schedstat: int | None = os.open(SCHEDSTAT, os.O_RDONLY)
        except OSError:
            self._schedstat = None

    def queued(self) -> int:
        """This thread's run-queue wait so far (ns; 0 without schedstat)."""
        if self._schedstat is None:
            return 0
        return int(os.pread(self._schedstat, 64, 0).split()[1])

    def traced(self, call: Callable[[], Any], ready: Callable[[Any], bool]) -> Any:
        queued = self.queued()
        result = call()
        returned = time.perf_counter_ns()
        if ready(result):
            self.returns.append(IoReturn(returned, self.queued() - queued))
        return result

    def before(self, at_ns: int) -> IoReturn | None:
        """The last traced return at or before ``at_ns``."""
        last = None
        for record in self.returns:
            if record.returned_ns > at_ns:
                break
            last = record
        return last


LOG = IoLog()


class TracedSelector(selectors.DefaultSelector):
    """The event loop's selector, logging each ``select`` that returned events."""

    def select(self, timeout: float | None = None) -> list[Any]:
        events: list[Any] = LOG.traced(lambda: super(TracedSelector, self).select(timeout), bool)
        return events


def trace_handshakes() -> None:
    """Log each TLS handshake's completion in ``ssl.SSLObject`` (asyncio's memory-BIO TLS; the
    calls that want more data raise, and are not logged)."""
    original = ssl.SSLObject.do_handshake

    def do_handshake(self: ssl.SSLObject) -> None:
        LOG.traced(lambda: original(self), lambda _: True)

    ssl.SSLObject.do_handshake = do_handshake  # type: ignore[method-assign]


def trace_httpcore_sync() -> None:
    """Log the returns of httpcore's sync TCP connect, TLS handshake and socket reads."""
    backend = httpcore._backends.sync
    for cls, name, ready in (
        (backend.SyncBackend, "connect_tcp", lambda _: True),
        (backend.SyncStream, "start_tls", lambda _: True),
        (backend.SyncStream, "read", bool),
    ):
        original = getattr(cls, name)

        def wrapper(
            *args: Any, _original: Any = original, _ready: Any = ready, **kwargs: Any
        ) -> Any:
            return LOG.traced(lambda: _original(*args, **kwargs), _ready)

        setattr(cls, name, wrapper)


# -- curl and child processes ---------------------------------------------------------------------


@dataclass
class Exited:
    out: str
    run_queue: float  # s, over the process's life


def run_process(command: list[str]) -> Exited:
    """Run ``command``; its stdout, and its run-queue wait, read from ``/proc/PID/schedstat``
    once it has exited and before it is reaped (a zombie keeps its scheduler statistics)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stderr is not None
    out, err = process.stdout.read(), process.stderr.read()
    os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
    try:
        with open(f"/proc/{process.pid}/schedstat") as stat:
            queued = int(stat.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        queued = float("nan")
    if process.wait() != 0:
        raise RuntimeError(f"{command[0]}: exit {process.returncode}: {err}")
    return Exited(out, queued)


def curl(server: Server) -> Sample:
    """One curl process, a fresh connection: its phases from ``-w``."""
    done = run_process(
        ["curl", "-sS", "--http1.1", "-o", "/dev/null", "--cacert", server.ca_file,
         "-H", "content-type: application/json", "--data", json.dumps(BODY),
         "-w", CURL_FORMAT, server.url],
    )  # fmt: skip
    lookup, connect, appconnect, pretransfer, starttransfer, total, code = done.out.split()
    if code != "200":
        raise RuntimeError(f"curl: HTTP {code}")
    phases = {
        "connect": float(connect) - float(lookup),
        "tls": float(appconnect) - float(connect),
        "first byte": float(starttransfer) - float(pretransfer),
        "total": float(total),
    }
    return Sample(phases, run_queue=done.run_queue)


def in_new_process(server: Server, client: str) -> Sample:
    """One instrumented request from a fresh Python process (``--child``), as curl makes it."""
    done = run_process([sys.executable, __file__, "--child", client, server.url, server.ca_file])
    return Sample(json.loads(done.out)["phases"], run_queue=done.run_queue)


# -- the instrumented clients ---------------------------------------------------------------------


def httpx_sync(server: Server, context: ssl.SSLContext) -> None:
    with httpx.Client(verify=context) as client:
        client.post(server.url, json=BODY).raise_for_status()


async def httpx_async(server: Server, context: ssl.SSLContext) -> None:
    async with httpx.AsyncClient(verify=context) as client:
        (await client.post(server.url, json=BODY)).raise_for_status()


async def aiohttp_request(server: Server, context: ssl.SSLContext) -> None:
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session,
        session.post(server.url, json=BODY) as response,
    ):
        response.raise_for_status()
        await response.read()


def requests_request(server: Server) -> None:
    # verify= a CA file: urllib3 builds the SSL context per connection, in the tls phase.
    with requests.Session() as session:
        session.post(server.url, json=BODY, verify=server.ca_file).raise_for_status()


class Instrumented:
    """The instrumented clients of this process, exporting to memory."""

    def __init__(self, server: Server, trace: bool) -> None:
        self.server = server
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        llm_latency.instrument(
            tracer_provider=provider,
            meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]),
            configure=False,
        )
        self.context = ssl.create_default_context(cafile=server.ca_file)
        self.trace = trace
        self.loop = asyncio.SelectorEventLoop(TracedSelector() if trace else None)

    def close(self) -> None:
        self.loop.close()
        llm_latency.uninstrument()

    def request(self, client: str) -> Sample:
        if client == "curl2":
            return curl(self.server)
        if client.endswith("-process"):
            return in_new_process(self.server, client.removesuffix("-process"))
        self.exporter.clear()
        LOG.returns.clear()
        # Span times are epoch ns, converted from the attempt's perf_counter readings: an
        # offset taken the same way converts them back.
        offset = time.time_ns() - time.perf_counter_ns()
        queued = LOG.queued()
        if client == "httpx":
            httpx_sync(self.server, self.context)
        elif client == "httpx-async":
            self.loop.run_until_complete(httpx_async(self.server, self.context))
        elif client == "aiohttp":
            self.loop.run_until_complete(aiohttp_request(self.server, self.context))
        else:
            requests_request(self.server)
        sample = self._sample(client, offset)
        sample.run_queue = (LOG.queued() - queued) / 1e9
        return sample

    def _sample(self, client: str, offset: int) -> Sample:
        spans = self.exporter.get_finished_spans()
        (request,) = [s for s in spans if s.kind is SpanKind.CLIENT]
        assert request.context is not None
        phases: dict[str, ReadableSpan] = {
            str((s.attributes or {})["llm_latency.phase"]): s
            for s in spans
            if s.parent is not None and s.parent.span_id == request.context.span_id
        }
        sample = Sample(
            {
                "connect": seconds(phases["connect"]),
                "tls": seconds(phases["tls"]),
                "first byte": seconds(phases["send"]) + seconds(phases["wait"]),
                "total": seconds(request),
            },
            descheduled=float((request.attributes or {}).get(DESCHEDULED, 0.0)),  # type: ignore[arg-type]
        )
        if self.trace and client in TRACED:
            for name in ENDS:
                end = phases[name].end_time
                assert end is not None
                io = LOG.before(end - offset)
                if io is not None:
                    sample.after_io[name] = (end - offset - io.returned_ns) / 1e9
                    sample.queued[name] = io.queued_ns / 1e9
        return sample


def seconds(span: ReadableSpan) -> float:
    assert span.start_time is not None
    assert span.end_time is not None
    return (span.end_time - span.start_time) / 1e9


# -- a condition: interleaved rounds --------------------------------------------------------------


@dataclass
class Condition:
    burners: int
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)
    busy: float = 0.0  # the machine's CPU busy share over the condition
    #: Mean of ``runnable()`` sampled before each request (this process, running, included).
    runnable: float = 0.0
    curl: list[Sample] = field(default_factory=list)
    clients: dict[str, list[Sample]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.burners} burners, load {self.load[0]:.1f}, {self.runnable:.1f} runnable"


def run_condition(
    server: Server, instrumented: Instrumented, count: int, rounds: int, clients: tuple[str, ...]
) -> Condition:
    condition = Condition(count, clients={name: [] for name in clients})
    order = ["curl", *clients]
    seen: list[int] = []
    with burners(count):
        busy0, total0 = cpu_ticks()
        for round_number in range(rounds):
            shift = round_number % len(order)
            for name in order[shift:] + order[:shift]:
                seen.append(runnable())
                if name == "curl":
                    condition.curl.append(curl(server))
                else:
                    condition.clients[name].append(instrumented.request(name))
        busy1, total1 = cpu_ticks()
        condition.load = os.getloadavg()
    condition.busy = (busy1 - busy0) / max(total1 - total0, 1)
    condition.runnable = statistics.mean(seen)
    return condition


# -- the report -----------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def compare(curl_values: list[float], values: list[float]) -> tuple[float, float, float, float]:
    """(curl p50, client p50, p50 difference, largest |difference| of matched percentiles)."""
    ours, theirs = statistics.median(values), statistics.median(curl_values)
    worst = max(abs(percentile(values, p) - percentile(curl_values, p)) for p in PERCENTILES)
    return theirs, ours, ours - theirs, worst


def ms(value: float, signed: bool = False) -> str:
    return f"{value * 1000:+.2f}" if signed else f"{value * 1000:.2f}"


def spread(values: list[float]) -> str:
    return " / ".join(ms(percentile(values, p)) for p in (50, 90, 100))


def describe(condition: Condition) -> str:
    one, five, _ = condition.load
    return (
        f"{condition.burners} burner{'s' if condition.burners != 1 else ''}: load average "
        f"{one:.2f} (1 min) {five:.2f} (5 min), CPU busy {condition.busy:.0%}, "
        f"{condition.runnable:.1f} tasks runnable on average"
    )


def table(head: tuple[str, ...], rows: list[tuple[str, ...]], markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join("---" if i < 3 else "---:" for i in range(len(head))) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    for row in (head, *rows):
        print("  ".join(cell.ljust(w) if i < 3 else cell.rjust(w)
                        for i, (cell, w) in enumerate(zip(row, widths, strict=True))))  # fmt: skip


def report(conditions: list[Condition], markdown: bool) -> None:
    print("phases, ms: medians, their difference (client - curl), and the largest |difference|")
    print("of matched percentiles p10, p25, p50, p75, p90")
    head = ("condition", "client", "phase", "curl p50", "client p50", "Δ p50", "max |Δ|")
    rows: list[tuple[str, ...]] = []
    for condition in conditions:
        for client, samples in condition.clients.items():
            for phase in PHASES:
                theirs, ours, diff, worst = compare(
                    [c.phases[phase] for c in condition.curl], [s.phases[phase] for s in samples]
                )
                rows.append(
                    (condition.label, client, phase, ms(theirs), ms(ours), ms(diff, True), ms(worst))
                )  # fmt: skip
    table(head, rows, markdown)

    print("\nrun-queue wait, ms p50 / p90 / max: a process's over its life (curl, *-process),")
    print("the client thread's over the request (in-process clients); and what llm-latency")
    print(f"reports as the machine's (async clients: {DESCHEDULED})")
    queue_rows: list[tuple[str, ...]] = []
    for condition in conditions:
        curl_wait = spread([s.run_queue for s in condition.curl])
        queue_rows.append((condition.label, "curl", "", curl_wait, "-"))
        for client, samples in condition.clients.items():
            reported = spread([s.descheduled for s in samples]) if client in ASYNC else "-"
            queue_rows.append(
                (condition.label, client, "", spread([s.run_queue for s in samples]), reported)
            )
    table(("condition", "client", "", "run-queue wait", "descheduled"), queue_rows, markdown)

    traced = [
        (condition, client, samples)
        for condition in conditions
        for client, samples in condition.clients.items()
        if any(s.after_io for s in samples)
    ]
    if not traced:
        return
    print("\nphase ends, ms p50 / p90 / max: from the last I/O return before it to its timestamp")
    print("(client work), and the run-queue wait inside that I/O call (wake-up delay)")
    ends = ("condition", "client", "phase end", "after the I/O return", "run-queue wait")
    rows.clear()
    for condition, client, samples in traced:
        for name in ENDS:
            after = [s.after_io[name] for s in samples if name in s.after_io]
            queued = [s.queued[name] for s in samples if name in s.queued]
            if after:
                rows.append((condition.label, client, name, spread(after), spread(queued)))
    table(ends, rows, markdown)


# -- main -----------------------------------------------------------------------------------------


def child(client: str, url: str, ca_file: str) -> None:
    """``--child``: one instrumented request, its phases as JSON on stdout."""
    instrumented = Instrumented(Server(url, ca_file), trace=False)
    try:
        sample = instrumented.request(client)
    finally:
        instrumented.close()
    print(json.dumps({"phases": sample.phases}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=25, help="rounds per condition")
    parser.add_argument("--tls-delay", type=float, default=0.1, help="D, seconds")
    parser.add_argument("--ttfb", type=float, default=0.2, help="T, seconds")
    parser.add_argument("--burners", default="0,2", help="burner processes per condition")
    parser.add_argument(
        "--clients",
        default=",".join(CLIENTS),
        help=f"of {', '.join(CLIENTS + EXTRA_CLIENTS)}",
    )
    parser.add_argument("--no-trace", action="store_true", help="no I/O return tracing")
    parser.add_argument("--markdown", action="store_true", help="tables in Markdown")
    parser.add_argument("--json", type=Path, help="write every sample here")
    parser.add_argument("--child", nargs=3, metavar=("CLIENT", "URL", "CA"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    clients = tuple(c for c in args.clients.split(",") if c)
    unknown = set(clients) - set(CLIENTS + EXTRA_CLIENTS)
    if unknown:
        parser.error(f"unknown clients: {', '.join(sorted(unknown))}")
    trace = not args.no_trace
    if trace:
        trace_httpcore_sync()
        trace_handshakes()
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}, "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    conditions = []
    with mock_server(args.tls_delay, args.ttfb) as server:
        print(f"mock-server --tls --tls-delay {args.tls_delay} --ttfb {args.ttfb} --tokens 1 "
              f"at {server.url}; {args.requests} rounds per condition")  # fmt: skip
        instrumented = Instrumented(server, trace)
        try:
            for client in ("curl", *clients):  # warm up: first connections, the page cache
                if client == "curl":
                    curl(server)
                else:
                    instrumented.request(client)
            for count in (int(n) for n in args.burners.split(",")):
                condition = run_condition(server, instrumented, count, args.requests, clients)
                print(describe(condition))
                conditions.append(condition)
        finally:
            instrumented.close()
    print()
    report(conditions, args.markdown)
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in conditions], indent=1))


if __name__ == "__main__":
    main()
