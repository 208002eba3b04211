"""Nothing lost when a process ends: real servers, pools and programs that llm-latency set the
SDK up for, stopped the way deploys stop them (SIGTERM at once after the last request), export
every request span and a ``http.client.request.duration`` count equal to the requests, to a
loopback OTLP receiver the test starts; with the collector down, each process says so in one
line and the stop takes at most about a second longer."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from llm_latency.lifecycle import EXIT_BUDGET_S
from tests.checks import TRIES
from tests.cpu_waits import sampled_waits
from tests.otlp_receiver import OTLPReceiver
from tests.servers import LLMServer, unused_port

pytestmark = pytest.mark.xdist_group("stopping")

ROOT = Path(__file__).parent.parent
POOL_JOB = Path(__file__).parent / "programs" / "pool_job.py"
WARNING = "llm-latency: could not export"
REQUESTS = 12


def environment(endpoint: str, upstream: str, **extra: str) -> dict[str, str]:
    """A new user's environment: the endpoint, nothing else of OpenTelemetry's (``extra`` may
    set another PYTHONPATH, to run another checkout's llm-latency: bench/stopping.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE="delta",  # see tests/otlp_receiver
        UPSTREAM=upstream,
        PYTHONPATH=str(ROOT),
    )
    env.update(extra)
    return env


@dataclass
class Stopped:
    #: Seconds from the SIGTERM to the end of the process.
    stop: float
    returncode: int
    stdout: str
    stderr: str
    #: Seconds the machine held the stop: the run-queue waits of the process's threads, and
    #: those of its child that waited longest (the children stop side by side).
    machine: float = 0.0

    def warnings(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if WARNING in line]


def compared(down: Stopped, up: Stopped) -> str:
    """The two stops, in words."""
    return (
        f"{down.stop:.3f} s with the collector down against {up.stop:.3f} s; the machine held "
        f"them {down.machine:.3f} s and {up.machine:.3f} s"
    )


def held_longer(down: Stopped, up: Stopped, most: float) -> bool:
    """Whether the stop with the collector down took longer than the one with it up by more
    than ``most`` s, by no more than the machine held it longer: the end of a process (the
    exit budget's export attempts, the interpreter's exit) is work a loaded machine delays
    (beside ten CPU burners, gunicorn's master waited 3.2 s for a CPU and its workers 4.0 to
    4.3 s each in a stop of 7.8 s), and such a run says nothing of the budget. The run with
    the collector down then runs again, up to TRIES times; a stop later than that fails at
    once."""
    beyond = down.stop - up.stop - most
    return 0 < beyond <= down.machine - up.machine


def get(url: str, deadline: float) -> None:
    """One request to the service, waiting for it to listen first."""
    while True:
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                assert response.status == 200
                return
        except (ConnectionError, urllib.error.URLError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def serve_and_stop(
    command: list[str], port: int, env: dict[str, str], n: int = REQUESTS, wait: float = 0.0
) -> Stopped:
    """Start the service, send it ``n`` requests, then SIGTERM ``wait`` seconds after."""
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        for _ in range(n):
            get(f"http://127.0.0.1:{port}/", deadline)
        time.sleep(wait)
        return terminate(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def terminate(process: subprocess.Popen[str]) -> Stopped:
    """SIGTERM, then what the process printed, how long it took to end and how long the
    machine held it (:attr:`Stopped.machine`, sampled: the processes end)."""
    with sampled_waits(process.pid, with_children=True) as waited:
        process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        stdout, stderr = process.communicate(timeout=60)
        took = time.monotonic() - sent
    children = [wait for pid, wait in waited.processes.items() if pid != process.pid]
    machine = waited.of(process.pid) + max(children, default=0.0)
    return Stopped(took, process.returncode, stdout, stderr, machine)


def server_command(kind: str, port: int) -> list[str]:
    bind = f"127.0.0.1:{port}"
    gunicorn = [sys.executable, "-m", "gunicorn", "-b", bind, "--graceful-timeout", "20"]
    return {
        "gunicorn sync": [*gunicorn, "-w", "3", "--preload", "tests.programs.served:wsgi"],
        "gunicorn gthread": [
            *gunicorn, "-w", "2", "-k", "gthread", "--threads", "2", "tests.programs.served:wsgi",
        ],
        "gunicorn uvicorn": [
            *gunicorn, "-w", "2", "-k", "uvicorn_worker.UvicornWorker",
            "tests.programs.served:asgi",
        ],
        "uvicorn --workers 2": [
            sys.executable, "-m", "uvicorn", "--workers", "2", "--host", "127.0.0.1",
            "--port", str(port), "tests.programs.served:asgi",
        ],
        "hypercorn": [
            sys.executable, "-m", "hypercorn", "--workers", "2", "-b", bind,
            "tests.programs.served:asgi",
        ],
    }[kind]  # fmt: skip


#: Processes that may make requests, per kind of service: one warning line each at most.
WORKERS = {
    "gunicorn sync": 3,
    "gunicorn gthread": 2,
    "gunicorn uvicorn": 2,
    "uvicorn --workers 2": 2,
    "hypercorn": 2,
}


async def run_service(kind: str, endpoint: str, upstream: str, **extra: str) -> Stopped:
    port = unused_port()
    env = environment(endpoint, upstream, **extra)
    return await asyncio.to_thread(serve_and_stop, server_command(kind, port), port, env)


@pytest.mark.parametrize("kind", list(WORKERS))
async def test_a_service_stopped_by_sigterm_exports_every_request(
    server: LLMServer, kind: str
) -> None:
    receiver = OTLPReceiver()
    try:
        up = await run_service(kind, receiver.endpoint, server.url())
    finally:
        receiver.stop()
    assert up.warnings() == [], up.stderr
    assert len(receiver.request_spans) == REQUESTS, up.stderr
    assert receiver.duplicated_spans() == []
    assert receiver.duration_count == REQUESTS
    assert up.stop < 10, up.stop  # graceful: no worker waited out a timeout

    # The exporters retry for 10 s when nothing bounds them; llm-latency gives them a second.
    for _ in range(TRIES):
        down = await run_service(kind, f"http://127.0.0.1:{unused_port()}", server.url())
        if not held_longer(down, up, 2.5):
            break
    assert 1 <= len(down.warnings()) <= WORKERS[kind], down.stderr
    assert down.stop - up.stop < 2.5, compared(down, up)


async def test_a_preloaded_master_exports_its_own_and_workers_only_theirs(
    server: LLMServer,
) -> None:
    # instrument() and one call in gunicorn's master (--preload), then requests in 3 forked
    # workers: the master's call is exported once, by the master; each worker starts empty.
    receiver = OTLPReceiver()
    try:
        stopped = await run_service("gunicorn sync", receiver.endpoint, server.url(), WARMUP="1")
    finally:
        receiver.stop()
    assert stopped.warnings() == [], stopped.stderr
    assert receiver.duplicated_spans() == []
    assert len(receiver.request_spans) == REQUESTS + 1
    assert receiver.duration_count == REQUESTS + 1


def run_job(
    mode: str, endpoint: str, url: str, n: int = REQUESTS, **env: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    """The job to its end; the seconds from its last line of work (DONE) to its exit."""
    result = subprocess.run(
        [sys.executable, str(POOL_JOB), mode, url, str(n)],
        cwd=ROOT, env=environment(endpoint, url, **env), capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    ended = time.monotonic()
    assert result.returncode == 0, result.stderr
    (done,) = [line for line in result.stdout.splitlines() if line.startswith("DONE ")]
    return result, ended - float(done.split()[1])


@pytest.mark.parametrize("mode", ["spawn", "fork", "exit"])
async def test_a_process_pool_exports_every_request(server: LLMServer, mode: str) -> None:
    # spawn: children leave by a normal exit; fork: through os._exit, after multiprocessing's
    # finalizers; exit: a fork child that calls sys.exit(3), whose status must stay 3.
    receiver = OTLPReceiver()
    try:
        up, up_exit = await asyncio.to_thread(run_job, mode, receiver.endpoint, server.url())
    finally:
        receiver.stop()
    assert WARNING not in up.stderr, up.stderr
    assert len(receiver.request_spans) == REQUESTS
    assert receiver.duplicated_spans() == []
    assert receiver.duration_count == REQUESTS
    if mode == "exit":
        assert "EXITCODE 3" in up.stdout

    down_endpoint = f"http://127.0.0.1:{unused_port()}"
    down, down_exit = await asyncio.to_thread(run_job, mode, down_endpoint, server.url())
    assert 1 <= down.stderr.count(WARNING) <= 2, down.stderr
    # Each of the job's three processes (the parent and two workers) spends at most its exit
    # budget on the unreachable collector; even one after the other, on a loaded machine, that
    # stays under a budget per process and one more, where unbounded exporters retry for 10 s.
    assert down_exit - up_exit < 4 * EXIT_BUDGET_S, (down_exit, up_exit)


def run_plain(endpoint: str, url: str, n: int = REQUESTS, **env: str) -> Stopped:
    """``python app.py``: its calls, then SIGTERM at once."""
    process = subprocess.Popen(
        [sys.executable, str(POOL_JOB), "plain", url, str(n)],
        cwd=ROOT, env=environment(endpoint, url, **env), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "READY\n"
        return terminate(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


async def test_a_plain_program_stopped_by_sigterm_exports_and_still_dies_of_it(
    server: LLMServer,
) -> None:
    receiver = OTLPReceiver()
    try:
        up = await asyncio.to_thread(run_plain, receiver.endpoint, server.url())
    finally:
        receiver.stop()
    assert up.returncode == -signal.SIGTERM  # what the default action gives, unchanged
    assert up.stderr == ""
    assert len(receiver.request_spans) == REQUESTS
    assert receiver.duration_count == REQUESTS

    for _ in range(TRIES):
        down_endpoint = f"http://127.0.0.1:{unused_port()}"
        down = await asyncio.to_thread(run_plain, down_endpoint, server.url())
        if not held_longer(down, up, 2.0):
            break
    assert down.returncode == -signal.SIGTERM
    assert len(down.warnings()) == 1, down.stderr
    assert down.stop - up.stop < 2.0, compared(down, up)


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """Debian's redis-server on a free loopback port, in memory only: the broker's URL."""
    port = unused_port()
    process = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(10)


def celery_run(
    broker: str, endpoint: str, server: LLMServer, n: int = REQUESTS, **extra: str
) -> Stopped:
    """A prefork Celery worker of 2 processes runs ``n`` tasks, then SIGTERM at once (its
    warm shutdown) when the LLM server has seen them all."""
    from celery import Celery

    env = environment(endpoint, server.url(), BROKER=broker, **extra)
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.programs.celery_tasks", "worker",
         "--pool", "prefork", "--concurrency", "2", "--loglevel", "WARNING", "--without-gossip",
         "--without-mingle", "--without-heartbeat"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    client = Celery("client", broker=broker)
    try:
        seen = len(server.requests)
        for _ in range(n):
            client.send_task("tests.programs.celery_tasks.call", args=[server.url()])
        deadline = time.monotonic() + 60
        while len(server.requests) < seen + n:
            assert time.monotonic() < deadline, "the tasks did not run"
            time.sleep(0.05)
        return terminate(worker)
    finally:
        client.close()
        if worker.poll() is None:
            worker.kill()
            worker.communicate()


async def test_celery_prefork_children_export_every_task(server: LLMServer) -> None:
    receiver = OTLPReceiver()
    try:
        with redis_server() as broker:
            up = await asyncio.to_thread(celery_run, broker, receiver.endpoint, server)
            for _ in range(TRIES):
                down_endpoint = f"http://127.0.0.1:{unused_port()}"
                down = await asyncio.to_thread(celery_run, broker, down_endpoint, server)
                if not held_longer(down, up, 2.5):
                    break
    finally:
        receiver.stop()
    assert up.warnings() == [], up.stderr
    assert len(receiver.request_spans) == REQUESTS
    assert receiver.duplicated_spans() == []
    assert receiver.duration_count == REQUESTS
    assert 1 <= len(down.warnings()) <= 2, down.stderr
    assert down.stop - up.stop < 2.5, compared(down, up)
