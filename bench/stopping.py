"""The table of docs/stopping.md: each way a service, pool or program is run and stopped, as a
new user runs it (``llm_latency.instrument()`` at import, the SDK set up by nobody, so
llm-latency sets it up from ``OTEL_*``), with a loopback OTLP receiver that counts what every
process exported; then the same with the collector down (stop time and warning lines).

The servers and programs are the tests' (tests/test_stopping.py, tests/programs/). ``--src
DIR`` runs another checkout's llm-latency (its ``src`` folder), to measure the code before a
change, e.g. ``git archive main src | tar -x -C /tmp/main``, then ``--src /tmp/main/src``.
Needs Debian's redis-server for the Celery row.

    python bench/stopping.py [--src DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.otlp_receiver import OTLPReceiver
from tests.servers import LLMServer, llm_server, unused_port
from tests.test_stopping import (
    ROOT,
    WARNING,
    celery_run,
    environment,
    redis_server,
    run_job,
    run_plain,
    serve_and_stop,
    server_command,
)


@dataclass
class Outcome:
    stop: float
    warnings: int


def service(kind: str, n: int, wait: float) -> Callable[[str, LLMServer, dict[str, str]], Outcome]:
    def run(endpoint: str, server: LLMServer, extra: dict[str, str]) -> Outcome:
        port = unused_port()
        env = environment(endpoint, server.url(), **extra)
        stopped = serve_and_stop(server_command(kind, port), port, env, n, wait)
        return Outcome(stopped.stop, len(stopped.warnings()))

    return run


def pool(mode: str, n: int) -> Callable[[str, LLMServer, dict[str, str]], Outcome]:
    def run(endpoint: str, server: LLMServer, extra: dict[str, str]) -> Outcome:
        result, exit_delay = run_job(mode, endpoint, server.url(), n, **extra)
        return Outcome(exit_delay, result.stderr.count(WARNING))

    return run


def plain(n: int) -> Callable[[str, LLMServer, dict[str, str]], Outcome]:
    def run(endpoint: str, server: LLMServer, extra: dict[str, str]) -> Outcome:
        stopped = run_plain(endpoint, server.url(), n, **extra)
        return Outcome(stopped.stop, len(stopped.warnings()))

    return run


def celery(n: int) -> Callable[[str, LLMServer, dict[str, str]], Outcome]:
    def run(endpoint: str, server: LLMServer, extra: dict[str, str]) -> Outcome:
        with redis_server() as broker:
            stopped = celery_run(broker, endpoint, server, n, **extra)
        return Outcome(stopped.stop, len(stopped.warnings()))

    return run


ROWS: list[tuple[str, int, Callable[[str, LLMServer, dict[str, str]], Outcome]]] = [
    ("gunicorn, 3 sync workers, `--preload`, SIGTERM", 30, service("gunicorn sync", 30, 0.0)),
    ("gunicorn, 2 gthread workers, SIGTERM", 30, service("gunicorn gthread", 30, 0.0)),
    ("gunicorn, 2 uvicorn workers, SIGTERM", 30, service("gunicorn uvicorn", 30, 0.0)),
    ("`ProcessPoolExecutor` (spawn), 2 children", 20, pool("spawn", 20)),
    ("`ProcessPoolExecutor` (fork), 2 children", 20, pool("fork", 20)),
    (
        "`uvicorn --workers 2`, SIGTERM 0.5 s after the last request",
        30,
        service("uvicorn --workers 2", 30, 0.5),
    ),
    ("the same, SIGTERM 8 s after the last request", 30, service("uvicorn --workers 2", 30, 8.0)),
    ("hypercorn, 2 workers, SIGTERM", 30, service("hypercorn", 30, 0.0)),
    ("Celery, prefork pool of 2, SIGTERM (warm shutdown)", 30, celery(30)),
    ("`python app.py`, SIGTERM", 20, plain(20)),
]


async def main(src: str | None) -> None:
    extra = {"PYTHONPATH": f"{src}:{ROOT}"} if src else {}
    print(
        "| how it runs | requests | request spans exported | `http.client.request.duration` "
        "count | stop (s) | collector down: stop (s), warning lines |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    async with llm_server() as server:
        for name, n, run in ROWS:
            receiver = OTLPReceiver()
            try:
                up = await asyncio.to_thread(run, receiver.endpoint, server, extra)
            finally:
                receiver.stop()
            nowhere = f"http://127.0.0.1:{unused_port()}"
            down = await asyncio.to_thread(run, nowhere, server, extra)
            print(
                f"| {name} | {n} | {len(receiver.request_spans)} | {receiver.duration_count} "
                f"| {up.stop:.1f} | {down.stop:.1f}, {down.warnings} |",
                flush=True,
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", help="another checkout's src folder to run instead")
    asyncio.run(main(parser.parse_args().src))
