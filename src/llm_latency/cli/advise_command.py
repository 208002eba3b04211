"""``llm-latency advise``: the findings service, run until SIGTERM or Ctrl-C."""

from __future__ import annotations

import signal
import threading
from types import FrameType

from llm_latency.advise import AdviseServer, Advisor, Settings
from llm_latency.cli.errors import CLIError


def run_advise(host: str, port: int, settings: Settings) -> None:
    """Serves the findings at ``host:port`` until a signal stops it."""
    try:
        server = AdviseServer((host, port), Advisor(settings))
    except OSError as exc:
        raise CLIError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    stop = threading.Event()

    def stopping(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stopping)
    serving = threading.Thread(target=server.serve_forever, name="llm-latency-advise-http")
    serving.start()
    server.start_diagnosis()
    print(
        f"llm-latency advise listening on {server.url}: OTLP/HTTP traces at /v1/traces, "
        f"findings at /, /findings.json and /metrics (a diagnosis every "
        f"{settings.interval:g} s over {settings.window:g} s)",
        flush=True,
    )
    stop.wait()
    server.shutdown()
    serving.join()
    server.server_close()
    print("llm-latency advise stopped", flush=True)
