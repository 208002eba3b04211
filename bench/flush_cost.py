"""What ``llm_latency.flush()`` costs a job or a serverless handler at the end of each
invocation, when llm-latency set the SDK up (OTLP over HTTP): with a collector that is up (a
small aiohttp OTLP receiver on loopback, made here) and with one that is down (a loopback port
nothing listens on).

Each of ROUNDS invocations makes CALLS requests with requests to a local server, then flushes
with the default timeout (1 s); the first flush also pays for the exporters' first connection.
Also timed: a flush with nothing buffered. Each state runs in a process of its own (the SDK is
set up once per process).

    python bench/flush_cost.py
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROUNDS = 20
CALLS = 10


class Upstream(BaseHTTPRequestHandler):
    """A small JSON answer to every GET, on a keep-alive connection."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = b'{"choices": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def start_collector() -> str:
    """An aiohttp OTLP/HTTP receiver on loopback that accepts everything: its endpoint."""
    from aiohttp import web

    async def accept(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(content_type="application/x-protobuf")

    started = threading.Event()
    port: list[int] = []

    async def serve() -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", accept)
        app.router.add_post("/v1/metrics", accept)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port.append(runner.addresses[0][1])
        started.set()
        await asyncio.Event().wait()

    threading.Thread(target=asyncio.run, args=(serve(),), daemon=True).start()
    started.wait(10)
    return f"http://127.0.0.1:{port[0]}"


def child(state: str) -> None:
    """One state's invocations, in this process: prints the flush times as JSON."""
    if state == "up":
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = start_collector()
    import requests

    import llm_latency

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    upstream.daemon_threads = True
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{upstream.server_address[1]}/v1/chat/completions"
    llm_latency.instrument()
    session = requests.Session()
    times, results = [], []
    for _ in range(ROUNDS):
        for _ in range(CALLS):
            session.get(url, timeout=5).raise_for_status()
        start = time.perf_counter()
        results.append(llm_latency.flush())
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    llm_latency.flush()
    idle = time.perf_counter() - start
    print(json.dumps({"times": times, "results": results, "idle": idle}))


def run(state: str, unused_port: int) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{unused_port}"
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent / "src")
    out = subprocess.run(
        [sys.executable, __file__, "--child", state],
        env=env, capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    result: dict[str, object] = json.loads(out.stdout.splitlines()[-1])
    result["warnings"] = sum("llm-latency:" in line for line in out.stderr.splitlines())
    return result


def main() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        nothing = sock.getsockname()[1]
    print(f"{ROUNDS} invocations of {CALLS} calls, each ended by llm_latency.flush() (timeout 1 s)")
    print(f"{'collector':<10} {'first':>9} {'median':>9} {'max':>9} {'idle':>9}  flushed  warnings")
    for state in ("up", "down"):
        result = run(state, nothing)
        times = [float(t) for t in result["times"]]  # type: ignore[attr-defined]
        flushed = sum(bool(r) for r in result["results"])  # type: ignore[attr-defined]
        print(
            f"{state:<10} {times[0] * 1e3:>7.1f}ms {statistics.median(times[1:]) * 1e3:>7.1f}ms "
            f"{max(times[1:]) * 1e3:>7.1f}ms {float(result['idle']) * 1e3:>7.1f}ms  "  # type: ignore[arg-type]
            f"{flushed:>3}/{ROUNDS}  {result['warnings']:>8}"
        )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        main()
