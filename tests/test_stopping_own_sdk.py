"""Where the program set the SDK up itself, its providers are its own to flush: docs/stopping.md's
recipes (flush in uvicorn's lifespan shutdown, a gunicorn ``worker_exit``, SIGTERM turned into
a normal exit) deliver every request."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.otlp_receiver import OTLPReceiver
from tests.servers import LLMServer, unused_port
from tests.test_stopping import REQUESTS, ROOT, environment, serve_and_stop

pytestmark = pytest.mark.xdist_group("stopping")

OWN_SDK = Path(__file__).parent / "programs" / "own_sdk.py"


def command(kind: str, port: int) -> list[str]:
    bind = f"127.0.0.1:{port}"
    return {
        "uvicorn --workers 2": [
            sys.executable, "-m", "uvicorn", "--workers", "2", "--host", "127.0.0.1",
            "--port", str(port), "tests.programs.own_sdk:asgi",
        ],
        "gunicorn uvicorn": [
            sys.executable, "-m", "gunicorn", "-b", bind, "-w", "2",
            "-k", "uvicorn_worker.UvicornWorker", "tests.programs.own_sdk:asgi",
        ],
        "gunicorn sync": [
            sys.executable, "-m", "gunicorn", "-b", bind, "-w", "2", "--preload",
            "-c", "tests/programs/gunicorn_flush.py", "tests.programs.own_sdk:wsgi",
        ],
    }[kind]  # fmt: skip


@pytest.mark.parametrize("kind", ["uvicorn --workers 2", "gunicorn uvicorn", "gunicorn sync"])
async def test_the_recipes_flush_the_programs_own_providers(server: LLMServer, kind: str) -> None:
    receiver = OTLPReceiver()
    port = unused_port()
    env = environment(receiver.endpoint, server.url())
    try:
        stopped = await asyncio.to_thread(serve_and_stop, command(kind, port), port, env)
    finally:
        receiver.stop()
    assert len(receiver.request_spans) == REQUESTS, stopped.stderr
    assert receiver.duplicated_spans() == []
    # Not delivered, or delivered short: each export's count, and what the service logged
    # (a worker its supervisor killed, an export that failed).
    exports = receiver.metric_exports()
    assert receiver.duration_count == REQUESTS, (exports, stopped.stderr)


def plain(endpoint: str, url: str) -> tuple[int, str]:
    process = subprocess.Popen(
        [sys.executable, str(OWN_SDK), url, str(REQUESTS)],
        cwd=ROOT, env=environment(endpoint, url), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    assert process.stdout.readline() == "READY\n"
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    return process.returncode, stderr


async def test_a_plain_programs_sigterm_recipe_exits_through_atexit(server: LLMServer) -> None:
    receiver = OTLPReceiver()
    try:
        returncode, stderr = await asyncio.to_thread(plain, receiver.endpoint, server.url())
    finally:
        receiver.stop()
    assert returncode == 128 + signal.SIGTERM, stderr  # what a shell reports for SIGTERM
    assert len(receiver.request_spans) == REQUESTS
    assert receiver.duration_count == REQUESTS
