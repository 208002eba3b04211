"""Process-wide state lives as long as what it describes (DESIGN.md, "Cost contract"), issue 48:

- instrumentations: ``instrument()`` and ``uninstrument()`` in a loop leave no emitter behind,
  and one import hook per module (wrapt's registry is process-wide and keeps what its hooks
  hold), which installs the live instrumentation when the module is imported;
- forks: a forked child counts no request of its parent's as in flight, loses no histogram
  record of an attribute set its parent recorded, and opens connections although a thread of
  its parent held the pool's locks at the fork;
- pools: a host leaves the pool series once it has been idle for their age, and a pool made
  under one instrumentation is read by the next.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests

import llm_latency
from llm_latency import emitter, pools
from tests.checks import histogram, int_value
from tests.conftest import Telemetry
from tests.otlp_receiver import OTLPReceiver
from tests.servers import LLMServer

ROOT = Path(__file__).parent.parent
PROGRAMS = Path(__file__).parent / "programs"

#: The series that carry a host and fall back to 0 when it is idle (open_connections twice:
#: active and idle).
HOST_SERIES = (
    "http.client.open_connections",
    "llm_latency.pool.waiting",
    "http.client.active_requests",
)


def series_total(telemetry: Telemetry, name: str) -> int:
    return sum(int_value(point) for point in telemetry.metric_points(name))


def hosts_reported(telemetry: Telemetry) -> dict[str, set[str]]:
    """The hosts each pool series reports now (at any value, 0 included)."""
    data = telemetry.reader.get_metrics_data()
    found: dict[str, set[str]] = {name: set() for name in HOST_SERIES}
    if data is None:
        return found
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name in found:
                    for point in metric.data.data_points:
                        found[metric.name].add(str((point.attributes or {})["server.address"]))
    return found


async def in_child(look: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Fork; what ``look()`` returns in the child (its exception's text, if it raises). The
    parent's event loop keeps running meanwhile: the loopback server the child calls is on it."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            try:
                seen = look()
            except BaseException as exc:
                seen = {"error": repr(exc)}
            os.write(write, json.dumps(seen).encode())
        finally:
            os._exit(0)
    os.close(write)

    def wait() -> bytes:
        with os.fdopen(read, "rb") as pipe:
            out = pipe.read()
        os.waitpid(pid, 0)
        return out

    return dict(json.loads(await asyncio.to_thread(wait) or b'{"error": "no answer"}'))


# -- instrumentations ---------------------------------------------------------------------------


def test_instrument_cycles_leave_no_emitter_and_one_import_hook_per_module() -> None:
    # A fresh process, where no hooked library is imported yet: every instrumentation waits for
    # each of them (the four clients and the installed SDKs).
    result = subprocess.run(
        [sys.executable, str(PROGRAMS / "instrument_cycles.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    cycles, last = (json.loads(line) for line in result.stdout.splitlines())
    hooks = cycles["hooks"]
    assert "aiohttp" in hooks and "urllib3" in hooks, hooks
    assert set(hooks.values()) == {1}, hooks  # one hook per module, not one per instrument()
    assert cycles["live"]["import_hooks"] == len(hooks)
    # The SDK keeps the first instrumentation's observable callbacks (same meter), hence one.
    assert cycles["emitters"] <= 1, cycles
    assert cycles["live"]["emitters"] == cycles["emitters"]
    # Imported after all that, aiohttp is instrumented by the instrumentation live then.
    assert last == {"request_spans": 1}


# -- forks --------------------------------------------------------------------------------------


async def test_a_forked_child_counts_none_of_its_parents_requests(
    telemetry: Telemetry, server: LLMServer
) -> None:
    # Two attempts in flight at the fork: requests waiting for the answer in a thread, and an
    # aiohttp response whose body is still coming.
    headers, arrived = server.arrival()
    waiting = threading.Thread(
        target=requests.get,
        args=(server.url(wait=1.0),),
        kwargs={"headers": headers, "timeout": 30},
    )
    waiting.start()
    await arrived.wait()
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url(chunks=2, gap=1.0)) as response:
            assert series_total(telemetry, "http.client.active_requests") == 2

            def look() -> dict[str, Any]:
                before = series_total(telemetry, "http.client.active_requests")
                live_before = llm_latency.live_state()
                # A request of the child's own: counted while it runs, then not.
                requests.get(server.url(), timeout=10).raise_for_status()
                after = series_total(telemetry, "http.client.active_requests")
                return {"before": before, "after": after, "live": live_before}

            seen = await in_child(look)
            await response.read()
    await asyncio.to_thread(waiting.join, 30)
    assert seen.get("before") == 0, seen  # not the parent's two
    assert seen["after"] == 0, seen
    assert seen["live"]["attempts_in_flight"] == 0, seen
    assert seen["live"]["aiohttp_streams"] == 0, seen
    assert series_total(telemetry, "http.client.active_requests") == 0  # the parent's ended


async def test_a_forked_child_connects_though_its_parent_held_the_pool_locks(
    telemetry: Telemetry, server: LLMServer
) -> None:
    # The moment the SDK's reader (or another request) holds a pool lock cannot be reached
    # from outside: a thread of the parent holds both, as that reader would, across the fork.
    active = emitter.active
    assert active is not None
    held, release = threading.Event(), threading.Event()

    def reader() -> None:
        with active.pools._lock, active.pools.lifetimes._lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=reader)
    holder.start()
    await asyncio.to_thread(held.wait, 10)

    def look() -> dict[str, Any]:
        # The child's first connection: its pool is watched, its connection counted.
        calling = threading.Thread(target=requests.get, args=(server.url(),), daemon=True)
        calling.start()
        calling.join(15)
        if calling.is_alive():
            return {"blocked": True}
        return {"blocked": False, "idle": series_total(telemetry, "http.client.open_connections")}

    try:
        seen = await in_child(look)
    finally:
        release.set()
        await asyncio.to_thread(holder.join, 10)
    assert seen == {"blocked": False, "idle": 0}, seen  # requests.get closes its session


def environment(endpoint: str) -> dict[str, str]:
    """A new user's environment: the collector's endpoint, nothing else of OpenTelemetry's
    (delta temporality: the counts of every export of every process add up)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE="delta",
        PYTHONPATH=os.pathsep.join(sys.path),
    )
    return env


async def test_a_forked_child_loses_no_record_of_an_attribute_set_its_parent_recorded(
    server: LLMServer,
) -> None:
    n = 3
    receiver = OTLPReceiver()
    try:
        result = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, str(PROGRAMS / "fork_records.py"), server.url(), str(n)],
            cwd=ROOT, env=environment(receiver.endpoint), capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
    finally:
        receiver.stop()
    assert result.returncode == 0, result.stderr
    assert "EXITCODE 0" in result.stdout, (result.stdout, result.stderr)
    assert receiver.duration_count == 2 + n, result.stderr  # the parent's two, the child's n


# -- pools --------------------------------------------------------------------------------------


async def test_a_host_leaves_the_pool_series_once_idle_for_their_age(
    telemetry: Telemetry, server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    age = 0.2
    monkeypatch.setattr(pools, "HOST_MAX_AGE", age)
    session = requests.Session()
    headers, arrived = server.arrival()
    calling = threading.Thread(
        target=session.get, args=(server.url(wait=0.3),), kwargs={"headers": headers}
    )
    calling.start()
    await arrived.wait()
    seen = hosts_reported(telemetry)  # in flight: its connection and its request
    await asyncio.to_thread(calling.join, 30)
    session.close()
    assert seen["http.client.open_connections"] == {server.host}, seen
    assert seen["http.client.active_requests"] == {server.host}, seen
    await asyncio.sleep(age * 1.5)  # idle since, for longer than the age
    assert hosts_reported(telemetry) == {name: set() for name in HOST_SERIES}
    assert llm_latency.live_state()["pool_hosts"] == 0


async def test_a_pool_made_under_one_instrumentation_is_read_by_the_next(
    server: LLMServer,
) -> None:
    first = Telemetry()
    first.instrument()
    session = requests.Session()
    try:
        await asyncio.to_thread(session.get, server.url())  # its pool and connection
        llm_latency.uninstrument()
        second = Telemetry()  # its own providers: the pool instruments are its own
        second.instrument()
        # The server closes the connection after this answer: the next request opens it again,
        # under the second instrumentation, in the pool made under the first.
        await asyncio.to_thread(session.get, server.url(header_Connection="close"))
        await asyncio.to_thread(session.get, server.url())
        idle = [
            int_value(point)
            for point in second.metric_points("http.client.open_connections")
            if (point.attributes or {}).get("http.connection.state") == "idle"
        ]
        assert idle == [1]
        durations = [
            histogram(p).count for p in second.metric_points("http.client.request.duration")
        ]
        assert sum(durations) == 2
    finally:
        llm_latency.uninstrument()
        session.close()
