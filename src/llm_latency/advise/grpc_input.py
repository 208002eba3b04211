"""OTLP/gRPC in: the ``TraceService/Export`` the Collector's ``otlp_grpc`` and ``loadbalancing``
exporters call (the loadbalancing exporter speaks gRPC only, and the bundle's Collector is built
without the ``otlp_http`` exporter: deploy/build/otelcol-builder.yaml).

It needs ``grpcio`` (the ``grpc`` extra): imported only when ``llm-latency advise`` is asked to
listen for gRPC (``--grpc-port``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from llm_latency.advise.advisor import Advisor
from llm_latency.advise.otlp_input import spans_of_message

#: The largest message accepted (the Collector's receiver default is 4 MiB; batches of 1024
#: spans with llm-latency's attributes stay well under 16).
MAX_MESSAGE = 16 * 1024 * 1024


def grpc_server(advisor: Advisor, address: str, workers: int = 4) -> Any:
    """A started gRPC server at ``address`` (``host:port``) whose ``Export`` feeds ``advisor``;
    stop it with ``.stop(grace)``. Raises ImportError without grpcio, OSError when the port is
    taken."""
    import grpc  # type: ignore[import-untyped]
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(
            self, request: ExportTraceServiceRequest, context: Any
        ) -> ExportTraceServiceResponse:
            advisor.receive(spans_of_message(request))
            return ExportTraceServiceResponse()

    server = grpc.server(
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="llm-latency-advise-grpc"),
        options=[("grpc.max_receive_message_length", MAX_MESSAGE)],
    )
    add = trace_service_pb2_grpc.add_TraceServiceServicer_to_server
    add(_TraceService(), server)  # type: ignore[no-untyped-call]
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot listen on {address}")
    server.start()
    return server
