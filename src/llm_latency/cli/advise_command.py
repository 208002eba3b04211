"""``llm-latency advise``: the findings service, run until SIGTERM or Ctrl-C."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from llm_latency.advise import AdviseServer, Advisor, Settings
from llm_latency.cli.errors import CLIError


def run_advise(
    host: str, port: int, settings: Settings, external_url: str | None, grpc_port: int | None
) -> None:
    """Serves the findings at ``host:port`` (and OTLP/gRPC at ``grpc_port``) until a signal
    stops it; ``external_url``: where the page's readers reach it (the alert's link)."""
    advisor = Advisor(settings)
    try:
        server = AdviseServer((host, port), advisor, external_url)
    except OSError as exc:
        raise CLIError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    receiver: Any = None
    if grpc_port is not None:
        try:
            from llm_latency.advise.grpc_input import grpc_server

            receiver = grpc_server(advisor, f"{host}:{grpc_port}")
        except ImportError as exc:
            server.server_close()
            raise CLIError(
                f"--grpc-port needs grpcio (pip install 'llm-latency[cli,grpc]'): {exc}"
            ) from None
        except (OSError, RuntimeError) as exc:
            server.server_close()
            raise CLIError(f"cannot listen on {host}:{grpc_port}: {exc}") from None
    stop = threading.Event()

    def stopping(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stopping)
    serving = threading.Thread(target=server.serve_forever, name="llm-latency-advise-http")
    serving.start()
    server.start_diagnosis()
    grpc_text = "" if grpc_port is None else f" and OTLP/gRPC on port {grpc_port}"
    print(
        f"llm-latency advise listening on {server.url}: OTLP/HTTP traces at /v1/traces"
        f"{grpc_text}, "
        f"findings at /, /findings.json and /metrics (a diagnosis every "
        f"{settings.interval:g} s over {settings.window:g} s)",
        flush=True,
    )
    stop.wait()
    if receiver is not None:
        receiver.stop(2).wait()
    server.shutdown()
    serving.join()
    server.server_close()
    print("llm-latency advise stopped", flush=True)
