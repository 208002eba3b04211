"""Concurrency and lifecycle: instrument() and uninstrument() while requests run in other
threads, two event loops in two threads, and forked workers that keep exporting."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import requests

import llm_latency
from tests.attributes import attributes
from tests.conftest import Telemetry
from tests.servers import LLMServer


async def test_instrument_and_uninstrument_while_requests_run(server: LLMServer) -> None:
    telemetry = Telemetry()
    url = server.url(wait=0.002)
    errors: list[BaseException] = []
    statuses: list[int] = []
    stop = threading.Event()

    def worker() -> None:
        session = requests.Session()
        while not stop.is_set():
            try:
                statuses.append(session.get(url, timeout=10).status_code)
            except BaseException as exc:  # the program must never see the plugin's faults
                errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(15):
            telemetry.instrument()
            await asyncio.sleep(0.03)
            llm_latency.uninstrument()
            await asyncio.sleep(0.01)
    finally:
        stop.set()

        def join_all() -> None:
            for thread in threads:
                thread.join(30)

        await asyncio.to_thread(join_all)
    assert errors == []
    assert statuses and set(statuses) == {200}
    assert telemetry.requests()  # some requests ran while instrumented
    telemetry.assert_all_ended_once()  # none left open by an uninstrument in the middle


def test_two_event_loops_in_two_threads(telemetry: Telemetry) -> None:
    from tests.servers import llm_server

    results: dict[str, int] = {}

    def loop_thread(name: str) -> None:
        async def main() -> None:
            async with llm_server() as own, aiohttp.ClientSession() as session:
                for _ in range(10):
                    async with session.get(own.url(wait=0.005, chunks=2, sse=1)) as response:
                        await response.read()
            results[name] = 10

        asyncio.run(main())

    threads = [threading.Thread(target=loop_thread, args=(f"t{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {"t0": 10, "t1": 10}
    requests_spans = telemetry.requests()
    assert len(requests_spans) == 20
    for span in requests_spans:
        assert {"send", "wait", "receive"} <= set(telemetry.phases(span))
        assert attributes(span)["llm_latency.stream.events"] == 3
    telemetry.assert_all_ended_once()


#: instrument(), then fork two workers that send requests and export their spans.
FORKING_PROGRAM = Path(__file__).parent / "programs" / "prefork.py"


async def test_forked_workers_keep_exporting(server: LLMServer) -> None:
    import http.server

    received: list[bytes] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    endpoint = f"http://127.0.0.1:{collector.server_address[1]}/v1/traces"
    started = time.monotonic()
    try:
        result = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, str(FORKING_PROGRAM), endpoint, server.url(wait=0.01)],
            capture_output=True, text=True, timeout=60, env=environment, check=False,
        )  # fmt: skip
    finally:
        collector.shutdown()
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 30
    exported = b"".join(received)
    for worker in (0, 1):
        assert f"worker={worker}".encode() in exported  # in url.full of that worker's spans
    assert exported.count(b"http.wait") >= 6
