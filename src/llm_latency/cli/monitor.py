"""``llm-latency watch``: probe as a continuous synthetic monitor.

Each endpoint of the config file is probed on its own schedule, once per kind:

- *edge*: a cheap request (a model listing), on a new connection each time, for DNS, connect,
  TLS and the time to the first byte;
- *inference*: a streamed completion of one output token, for the time to the first chunk and
  the server's own time where the provider sends it.

The loop behaves like a daemon: each wait is the interval with some jitter, at most
``max_in_flight`` probes run at once, a failed probe is a result (status, ``error.type``, the
failed phase) and never stops the loop, and SIGTERM or SIGINT end it, letting the probes in
flight finish for a short grace and exporting the last results. Keys are read from the
environment when a request is built and never printed: lines show the endpoint's name only.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Final

from opentelemetry.trace import SpanKind, Status, StatusCode

from llm_latency.cli.monitor_config import INFERENCE, Endpoint, MonitorConfig
from llm_latency.cli.monitor_export import (
    PROBE_ATTRIBUTES,
    PROBE_ENDPOINT,
    PROBE_KIND,
    Outcome,
    Telemetry,
)
from llm_latency.diagnosis.findings import duration
from llm_latency.diagnosis.records import (
    Attempt,
    children_by_parent,
    from_readable_spans,
    is_attempt,
    to_attempt,
)

#: The longest the probes in flight may take to finish once the monitor is told to stop (s).
STOP_GRACE: Final = 2.0


@dataclass
class ProbeResult:
    """One probe: which endpoint and kind, when, and the attempt it made (None when the
    request could not even start)."""

    endpoint: str
    kind: str
    started: float  # epoch seconds
    outcome: Outcome
    attempt: Attempt | None


Report = Callable[[ProbeResult], None]


def probe_attributes(endpoint: Endpoint, kind: str) -> dict[str, str]:
    """What every span and metric of a probe carries: endpoint, kind, labels."""
    return {PROBE_ENDPOINT: endpoint.name, PROBE_KIND: kind, **endpoint.labels}


def _outcome(attributes: dict[str, str], attempt: Attempt | None, error: str | None) -> Outcome:
    if attempt is None:
        return Outcome(attributes, 0.0, None, {}, None, error or "unknown", None)
    return Outcome(
        attributes,
        attempt.duration,
        attempt.first_byte,
        {phase.name: phase.duration for phase in attempt.phases},
        attempt.status,
        attempt.error or (None if attempt.status is not None else error),
        attempt.failed_phase,
        attempt.time_to_first_token,
    )


async def _send(endpoint: Endpoint, kind: str, timeout: float) -> None:
    """One request on a new connection (no pooled connection, no cached DNS answer), its body
    read to the end."""
    import aiohttp

    profile = endpoint.profile
    key = endpoint.api_key()
    call = profile.inference(endpoint.model, key) if kind == INFERENCE else profile.edge(key)
    connector = aiohttp.TCPConnector(force_close=True, use_dns_cache=False)
    async with (
        aiohttp.ClientSession(  # trust_env: the proxy of the network it watches from
            connector=connector, timeout=aiohttp.ClientTimeout(total=timeout), trust_env=True
        ) as session,
        session.request(
            call.method, endpoint.url + call.path, headers=list(call.headers), data=call.body
        ) as response,
    ):
        async for _ in response.content.iter_any():
            pass


async def probe_once(
    endpoint: Endpoint, kind: str, telemetry: Telemetry, timeout: float
) -> ProbeResult:
    """Probe ``endpoint`` once: a root span ``probe {endpoint} {kind}`` over llm-latency's
    request span. Never raises but for cancellation: a failure is the result's data."""
    attributes = probe_attributes(endpoint, kind)
    tracer = telemetry.tracer_provider.get_tracer("llm_latency.probe")
    started = time.time()
    error: str | None = None
    token = PROBE_ATTRIBUTES.set(attributes)
    try:
        with tracer.start_as_current_span(
            f"probe {endpoint.name} {kind}",
            kind=SpanKind.INTERNAL,
            record_exception=False,
            set_status_on_exception=False,
        ) as root:
            trace_id = root.get_span_context().trace_id
            telemetry.spans.watch(trace_id)
            try:
                await _send(endpoint, kind, timeout)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failed probe is data
                error = type(exc).__qualname__
                root.set_status(Status(StatusCode.ERROR, error))
            await asyncio.sleep(0)  # let the callbacks that end the request span run
    finally:
        PROBE_ATTRIBUTES.reset(token)
    records = from_readable_spans(telemetry.spans.take(trace_id))
    children = children_by_parent(records)
    attempt = next(
        (
            to_attempt(record, children.get(record.span_id, []))
            for record in records
            if is_attempt(record, children.get(record.span_id, []))
        ),
        None,
    )
    outcome = _outcome(attributes, attempt, error)
    telemetry.metrics.record(outcome)
    return ProbeResult(endpoint.name, kind, started, outcome, attempt)


def result_line(result: ProbeResult) -> str:
    """One line per probe: time, endpoint, kind, status or failure, and the phases."""
    at = datetime.fromtimestamp(result.started, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    outcome = result.outcome
    head = f"{at}  {result.endpoint}  {result.kind:<9}"
    phases = "  ".join(f"{name} {duration(seconds)}" for name, seconds in outcome.phases.items())
    if not outcome.up:
        what = [f"status {outcome.status}"] if outcome.status is not None else []
        if outcome.error is not None:
            where = f" in {outcome.failed_phase}" if outcome.failed_phase else ""
            what.append(f"{outcome.error}{where}")
        return f"{head}  failed: {', '.join(what)}" + (f"  ({phases})" if phases else "")
    parts = [f"{outcome.status}", f"total {duration(outcome.duration)}"]
    if outcome.ttfb is not None:
        parts.append(f"first byte {duration(outcome.ttfb)}")
    attempt = result.attempt
    if attempt is not None and attempt.time_to_first_chunk is not None:
        parts.append(f"first chunk {duration(attempt.time_to_first_chunk)}")
    if attempt is not None and attempt.time_to_first_token is not None:
        parts.append(f"first token {duration(attempt.time_to_first_token)}")
    if attempt is not None and attempt.output_tokens is not None:
        parts.append(f"tokens {attempt.input_tokens or '?'} in, {attempt.output_tokens} out")
    if attempt is not None and attempt.server_processing is not None:
        parts.append(f"server {duration(attempt.server_processing)}")
    return f"{head}  {'  '.join(parts)}  ({phases})"


class Monitor:
    """Runs the probes of ``config`` until :meth:`stop`; each result goes to ``report``."""

    def __init__(
        self,
        config: MonitorConfig,
        telemetry: Telemetry,
        report: Report,
        rng: random.Random | None = None,
        rounds: int | None = None,
    ) -> None:
        self.config = config
        #: Stop after this many probes of each endpoint and kind (None: until stopped).
        self.rounds = rounds
        self._telemetry = telemetry
        self._report = report
        self._rng = rng or random.Random()
        self._stopping = asyncio.Event()
        self._gate = asyncio.Semaphore(config.max_in_flight)
        self._in_flight: set[asyncio.Task[ProbeResult]] = set()
        #: The most probes seen in flight at once.
        self.peak_in_flight = 0

    def stop(self) -> None:
        """Stop scheduling probes (from the loop's thread: a signal handler)."""
        self._stopping.set()

    def _wait(self, every: float) -> float:
        jitter = self.config.jitter
        return every * (1 + self._rng.uniform(-jitter, jitter))

    async def _schedule(self, endpoint: Endpoint, kind: str) -> None:
        # A first probe at a random point of the first interval's jitter: endpoints and kinds
        # do not all fire at once.
        first = endpoint.every * self._rng.uniform(0, self.config.jitter)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), first)
        done = 0
        while not self._stopping.is_set():
            began = time.monotonic()
            async with self._gate:
                if self._stopping.is_set():
                    break
                task = asyncio.create_task(
                    probe_once(endpoint, kind, self._telemetry, self.config.timeout)
                )
                self._in_flight.add(task)
                self.peak_in_flight = max(self.peak_in_flight, len(self._in_flight))
                try:
                    result = await asyncio.shield(task)
                except asyncio.CancelledError:
                    break
                finally:
                    self._in_flight.discard(task)
            self._report(result)
            done += 1
            if self.rounds is not None and done >= self.rounds:
                break
            left = self._wait(endpoint.every) - (time.monotonic() - began)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), max(left, 0.0))

    async def run(self) -> None:
        """Probe until stopped; then give the probes in flight :data:`STOP_GRACE` seconds."""
        schedulers = [
            asyncio.create_task(self._schedule(endpoint, kind))
            for endpoint in self.config.endpoints
            for kind in endpoint.kinds
        ]

        async def all_done() -> None:  # with rounds, every scheduler ends by itself
            await asyncio.gather(*schedulers, return_exceptions=True)

        stopping = asyncio.create_task(self._stopping.wait())
        finished = asyncio.create_task(all_done())
        await asyncio.wait([stopping, finished], return_when=asyncio.FIRST_COMPLETED)
        self._stopping.set()
        await stopping
        in_flight = list(self._in_flight)
        if in_flight:
            _, pending = await asyncio.wait(in_flight, timeout=STOP_GRACE)
            for probe in pending:
                probe.cancel()
        await asyncio.wait(schedulers, timeout=STOP_GRACE)
        for scheduler in schedulers:
            scheduler.cancel()
        await finished


async def watch(
    config: MonitorConfig, telemetry: Telemetry, report: Report, rounds: int | None = None
) -> None:
    """Run a :class:`Monitor` until SIGTERM or SIGINT (or ``rounds`` probes of each)."""
    monitor = Monitor(config, telemetry, report, rounds=rounds)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, monitor.stop)
    try:
        await monitor.run()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def plan_lines(config: MonitorConfig) -> list[str]:
    """What is printed at start: the endpoints, their intervals, and the estimated calls per
    day (the cost guard). Names and labels only: never a key, nor the variable's value."""
    calls = config.calls_per_day()
    lines = [
        f"llm-latency watch: {len(config.endpoints)} endpoint"
        f"{'s' if len(config.endpoints) > 1 else ''}, at most {config.max_in_flight} probes "
        f"in flight, jitter {config.jitter:.0%}"
    ]
    for endpoint in config.endpoints:
        labels = ", ".join(f"{k}={v}" for k, v in endpoint.labels.items())
        lines.append(
            f"  {endpoint.name}: {endpoint.profile.name}, {endpoint.model}, "
            f"{' and '.join(endpoint.kinds)} every {endpoint.every:g}s"
            + (f" ({labels})" if labels else "")
        )
    lines.append(
        f"estimated calls per day: {calls['edge']} edge (no tokens), {calls['inference']} "
        "inference (1 output token at most each)"
    )
    return lines
