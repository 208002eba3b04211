"""Workloads made of causes: each cause a change to the same calls, so that any two can be laid
on the same attempts and the diagnosis asked whether two findings claim the same seconds.

An attempt is written as a :class:`Spec` (what each part of it took) and made into the
:class:`~llm_latency.diagnosis.Attempt` the emitter's spans would be read back as: its phases
one after another, the loop's stall and the machine's wait in its wait phase and its stream, its
first token at its first byte, its tokens then at their pace. A cause (:data:`CAUSES`) changes the specs of
some or all of the calls, and may ask for how the calls run: one after another (the default,
half a second apart), or all at once through a pool of a few connections.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from llm_latency.diagnosis import Attempt, Backoff, Call
from llm_latency.diagnosis.records import Phase

#: Calls in a workload.
CALLS = 12
#: The calls of the default run start this long (s) after the last one ended.
APART = 0.5
#: ... and those of ``small-prompts-one-by-one`` this soon.
AT_ONCE_AFTER = 0.01
#: The pool the calls go through when a cause runs them all at once.
POOL = 3
URL = "http://h/v1/chat/completions"


@dataclass
class Spec:
    """What one call's attempt took (s), by part; ``refused``: a 429 and a backoff before it."""

    prompt: int
    output: int = 20
    tpot: float = 0.005
    first: float = 0.5  # the provider's time to the first token
    streamed: bool = True
    dns: float = 0.0
    connect: float = 0.0
    tls: float = 0.0
    lag: float = 0.0  # the program's loop stall, half in the wait, half in the stream
    cpu: float = 0.0  # the machine's wait for a CPU, the same
    overhead: float = 0.0
    pause: float = 0.0  # a pause mid-stream
    protocol: str = "1.1"
    refused: bool = False


@dataclass
class Workload:
    """The calls' specs and how they run: ``apart`` (s) one after another, or all at once
    through a pool of ``pool`` connections; ``probed``: ``llm-latency watch`` probed the
    host meanwhile."""

    specs: list[Spec] = field(
        default_factory=lambda: [Spec(prompt=100 + 30 * i) for i in range(CALLS)]
    )
    apart: float = APART
    pool: int | None = None
    probed: bool = False


def _attempt(spec: Spec, start: float, queue: float) -> Attempt:
    # The loop's stall and the machine's wait: a third in the queue when there is one (the
    # stalled loop gave the connection late), the rest in the wait and the stream.
    queue_lag, queue_cpu = (spec.lag / 3, spec.cpu / 3) if queue else (0.0, 0.0)
    whole = spec
    spec = replace(spec, lag=spec.lag - queue_lag, cpu=spec.cpu - queue_cpu)
    phases = [Phase("queue", 0.0, queue + queue_lag + queue_cpu, queue_lag, queue_cpu or None)]
    phases = phases if queue else []
    at = queue + queue_lag + queue_cpu
    for name in ("dns", "connect", "tls"):
        took = getattr(spec, name)
        if took:
            phases.append(Phase(name, at, took))
            at += took
    phases.append(Phase("send", at, 0.001))
    at += 0.001
    decode = (spec.output - 1) * spec.tpot + spec.pause
    facts: dict[str, object]
    if spec.streamed:
        lag, cpu = spec.lag / 2, spec.cpu / 2  # the other half while reading the stream
        held = spec.overhead + lag + cpu
        phases.append(Phase("wait", at, spec.first + held, lag, cpu or None))
        at += spec.first + held
        facts = {"time_to_first_chunk": at, "time_to_first_token": at,
                 "time_per_output_token": (decode + lag + cpu) / (spec.output - 1),
                 "stream_events": spec.output, "stream_max_gap": spec.tpot + spec.pause,
                 "server_processing": spec.first}  # fmt: skip
        phases.append(Phase("receive", at, decode + lag + cpu + 0.001, lag, cpu or None))
        at += decode + lag + cpu + 0.001
    else:
        held = spec.overhead + spec.lag + spec.cpu
        phases.append(Phase("wait", at, spec.first + decode + held, spec.lag, spec.cpu or None))
        at += spec.first + decode + held
        facts = {"server_processing": spec.first + decode,
                 "server_time_per_output_token_max": (spec.first + decode) / spec.output}  # fmt: skip
        phases.append(Phase("receive", at, 0.001))
        at += 0.001
    return Attempt(int(start * 1e9), at, tuple(phases), url=URL, host="h", method="POST",
                   status=200, client="aiohttp", model="m", input_tokens=spec.prompt,
                   output_tokens=spec.output, cached_tokens=0, protocol=spec.protocol,
                   reused=not spec.connect, network_overhead=spec.overhead,
                   event_loop_lag=whole.lag, descheduled=whole.cpu,
                   **facts)  # type: ignore[arg-type]  # fmt: skip


def _refusal(spec: Spec, start: float, queue: float) -> Attempt:
    phases = [Phase("queue", 0.0, queue)] if queue else []
    phases += [Phase("send", queue, 0.001), Phase("wait", queue + 0.001, 0.05),
               Phase("receive", queue + 0.051, 0.001)]  # fmt: skip
    return Attempt(int(start * 1e9), queue + 0.052, tuple(phases), url=URL, host="h",
                   method="POST", status=429, error="429", client="aiohttp",
                   protocol=spec.protocol, event_loop_lag=0.0)  # fmt: skip


#: A refused attempt's wait before its retry (s).
BACKOFF = 0.5


def _call(spec: Spec, start: float, queue: float = 0.0) -> Call:
    """The call: its attempt after ``queue`` (s) for a connection; when refused, the refusal
    waits for it, and the retry after the backoff gets one at once."""
    attempts, backoffs = [], []
    at = start
    if spec.refused:
        refusal = _refusal(spec, at, queue)
        attempts.append(refusal)
        at += refusal.duration
        backoffs.append(Backoff(int(at * 1e9), BACKOFF, "429"))
        at += BACKOFF
        queue = 0.0
    attempts.append(_attempt(spec, at, queue))
    end = at + attempts[-1].duration
    return Call("chat", int(start * 1e9), end - start, attempts, backoffs)


def _probes() -> list[Call]:
    """Three inference probes of the host, fast, at the start of the calls."""
    calls = []
    for i in range(3):
        phases = (Phase("send", 0.0, 0.001), Phase("wait", 0.001, 0.1))
        probe = Attempt(int(i * 0.2 * 1e9), 0.101, phases, url=URL, host="h", method="POST",
                        status=200, server_processing=0.1, probe="h", probe_kind="inference")  # fmt: skip
        calls.append(Call("probe", probe.start_ns, probe.duration, [probe]))
    return calls


def calls_of(workload: Workload) -> list[Call]:
    """The workload's calls, laid out in time, and the probe's when it was probed."""
    calls: list[Call] = []
    if workload.pool is None:
        at = 0.0
        for spec in workload.specs:
            calls.append(_call(spec, at))
            at += calls[-1].duration + workload.apart
    else:  # in bursts of twice the pool: each waits for the first connection to be free
        at = 0.0
        burst = 2 * workload.pool
        for first in range(0, len(workload.specs), burst):
            free = [at] * workload.pool
            for spec in workload.specs[first : first + burst]:
                turn = heapq.heappop(free)
                call = _call(spec, at, queue=turn - at)
                heapq.heappush(free, at + call.duration)
                calls.append(call)
            at = max(free) + workload.apart
    return calls + (_probes() if workload.probed else [])


def _on(indexes: Iterable[int], change: Callable[[Spec], None]) -> Callable[[Workload], None]:
    def cause(workload: Workload) -> None:
        for i in indexes:
            change(workload.specs[i])

    return cause


def _every(change: Callable[[Spec], None]) -> Callable[[Workload], None]:
    return _on(range(CALLS), change)


def _both(*causes: Callable[[Workload], None]) -> Callable[[Workload], None]:
    def cause(workload: Workload) -> None:
        for each in causes:
            each(workload)

    return cause


def _pooled(workload: Workload) -> None:
    workload.pool = POOL


def _http2(workload: Workload) -> None:
    workload.pool = POOL
    for spec in workload.specs:
        spec.protocol = "2"


def _one_by_one(workload: Workload) -> None:
    workload.apart = AT_ONCE_AFTER


def _new_connections(spec: Spec) -> None:
    spec.dns += 0.02
    spec.connect += 0.03
    spec.tls += 0.05


def _slow_connect(spec: Spec) -> None:
    spec.connect += 0.15
    spec.tls += 0.15


def _long_prompt(workload: Workload) -> None:
    for i, spec in enumerate(workload.specs):
        spec.prompt = 1000 + 250 * i
        spec.first += 0.0006 * spec.prompt


def _not_streamed(spec: Spec) -> None:
    spec.streamed = False
    spec.first += 1.2


def _probed(workload: Workload) -> None:
    """What the probe shows and no other rule names: the program's own side 80 ms longer
    than the probe's (a stall and an overhead each under their rules' minimum)."""
    workload.probed = True
    for spec in workload.specs:
        spec.lag += 0.04
        spec.overhead += 0.04


def _more(**extra: float) -> Callable[[Spec], None]:
    def change(spec: Spec) -> None:
        for name, value in extra.items():
            setattr(spec, name, getattr(spec, name) + value)

    return change


def _set(**values: object) -> Callable[[Spec], None]:
    def change(spec: Spec) -> None:
        for name, value in values.items():
            setattr(spec, name, value)

    return change


#: Each rule whose finding has a saving, and a cause that makes it: the causes change
#: overlapping calls, so that two of them laid together meet on some attempts.
CAUSES: dict[str, Callable[[Workload], None]] = {
    "pool-queue": _pooled,
    "http2-stream-limit": _http2,
    "new-connections": _every(_new_connections),
    "slow-dns": _every(_more(dns=0.2)),
    "slow-connect": _every(_slow_connect),
    "event-loop-lag": _every(_more(lag=0.8)),
    "short-of-cpu": _every(_more(cpu=0.8)),
    "network-overhead": _both(_every(_more(overhead=0.6)), _on((0, 1, 2), _more(overhead=0.6))),
    "provider-queue": _on((0, 1, 2), _more(first=3.0)),
    "slow-generation": _on((2, 3, 4, 5), _set(tpot=0.05)),
    "long-prompt": _long_prompt,
    "long-answer": _every(_set(output=600)),
    "small-prompts-one-by-one": _one_by_one,
    "not-streamed": _on((9, 10, 11), _not_streamed),
    "stream-stall": _on((4,), _more(pause=1.2)),
    "rate-limits": _on((9, 10, 11), _set(refused=True)),
    "us-or-them": _probed,
}


def workload(causes: Sequence[str]) -> list[Call]:
    """The calls of a workload with ``causes`` laid on it, in the order given."""
    made = Workload()
    for cause in causes:
        CAUSES[cause](made)
    return calls_of(made)
