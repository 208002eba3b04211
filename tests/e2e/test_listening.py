"""Every socket the bundle's services listen on is on the loopback address the run gave the
service: no endpoint of a receiver, extension, exporter or the services' own telemetry falls
back to every address (``0.0.0.0``, ``::``) or to another one.

The sockets are read from the kernel, not from the configurations: each service's processes
(its session: the harness starts each in a new one), their socket file descriptors
(``/proc/<pid>/fd``), and those sockets in ``/proc/net/{tcp,tcp6,udp,udp6}`` (the services have
mount namespaces of their own but share the network namespace). Listening TCP sockets count,
and bound UDP sockets that have no peer (what receives datagrams: Alertmanager's cluster gossip
would be one).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.bundle import ADDRESSES, GATEWAY_SERVICE, HELM, Service
from tests.e2e.conftest import AgentPod, Run, report

PROC = Path("/proc")
TCP_LISTEN = "0A"
#: A UDP socket's state when it is not connected to a peer (TCP_CLOSE in /proc/net/udp).
UDP_UNCONNECTED = "07"

#: The ports each compose service's configuration opens: the check is not vacuous.
COMPOSE_PORTS = {
    "otel-collector": {4317, 4318, 8888, 8889, 13133},
    "jaeger": {4317, 4318, 8888, 13133, 16685, 16686},
    "prometheus": {9090},
    "alertmanager": {9093},
    "advise": {4317, 9466},  # llm-latency advise: OTLP/gRPC in; OTLP/HTTP in, page and metrics
}
#: The same for the Helm collector tiers (their configs as the chart renders them: its own
#: metrics on the pod IP's 8888).
HELM_PORTS = {"agent": {4317, 4318, 8888, 8889, 13133}, "gateway": {4317, 8888, 13133}}
HELM_VALUES = {
    "gateway": HELM / "otel-collector-gateway.values.yaml",
    "agent": HELM / "otel-collector-agent.values.yaml",
}


@dataclass(frozen=True, order=True)
class Socket:
    """A socket that receives: its protocol, address and port."""

    protocol: str
    address: str
    port: int

    def __str__(self) -> str:
        return f"{self.protocol} {self.address}:{self.port}"


def proc_address(hex_address: str) -> str:
    """An address as /proc/net/* writes it: the 32-bit words of the address, each in the
    host's byte order (``0100007F`` is 127.0.0.1 on a little-endian machine)."""
    raw = bytes.fromhex(hex_address)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(raw)
    # An IPv4-mapped address (grpcio binds "127.0.10.8:4317" as ::ffff:127.0.10.8 on an IPv6
    # socket) receives on that IPv4 address only.
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def receiving_sockets() -> dict[int, Socket]:
    """The network namespace's listening TCP and unconnected UDP sockets, by inode."""
    sockets: dict[int, Socket] = {}
    for protocol, state in (
        ("tcp", TCP_LISTEN),
        ("tcp6", TCP_LISTEN),
        ("udp", UDP_UNCONNECTED),
        ("udp6", UDP_UNCONNECTED),
    ):
        for line in (PROC / "net" / protocol).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == state:
                address, port = fields[1].split(":")
                sockets[int(fields[9])] = Socket(protocol, proc_address(address), int(port, 16))
    return sockets


def session_processes(session: int) -> list[int]:
    """The processes of a session."""
    pids = []
    for stat in PROC.glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # after "pid (comm)": state, ppid, process group, session, ...
            if int(stat.read_text().rsplit(")", 1)[1].split()[3]) == session:
                pids.append(int(stat.parent.name))
    return pids


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets that process ``pid`` has open."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in (PROC / str(pid) / "fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(int(target.removeprefix("socket:[").removesuffix("]")))
    return inodes


def listening(service: Service) -> set[Socket]:
    """The sockets on which ``service``'s processes receive."""
    assert service.process is not None and service.process.poll() is None, f"{service.name} down"
    sockets = receiving_sockets()
    pids = session_processes(service.process.pid)
    assert service.process.pid in pids
    inodes = set().union(*(socket_inodes(pid) for pid in pids))
    return {sockets[inode] for inode in inodes if inode in sockets}


def check_on_its_address(service: Service, ports: set[int]) -> set[Socket]:
    """Asserts that every socket ``service`` receives on is on its own address, and that it
    listens on ``ports``; returns the sockets."""
    found = listening(service)
    elsewhere = sorted(str(s) for s in found if s.address != ADDRESSES[service.name])
    assert not elsewhere, f"{service.name} listens beyond {ADDRESSES[service.name]}: {elsewhere}"
    missing = ports - {s.port for s in found if s.protocol in ("tcp", "tcp6")}
    assert not missing, f"{service.name} does not listen on {sorted(missing)}: {sorted(found)}"
    return found


def _ports(found: set[Socket]) -> str:
    return " ".join(str(port) for port in sorted({s.port for s in found}))


@pytest.mark.parametrize("name", sorted(COMPOSE_PORTS))
def test_each_compose_service_listens_on_its_loopback_address_only(run: Run, name: str) -> None:
    found = check_on_its_address(run.bundle.services[name], COMPOSE_PORTS[name])
    report(f"{name} listens on {ADDRESSES[name]} only: {_ports(found)}")


@pytest.fixture(scope="module")
def helm_tiers(run: Run, agent_pod: AgentPod) -> Iterator[dict[str, Service]]:
    # the gateway first: the agent's load_balancing exporter resolves it; the agent's
    # k8s_attributes reads the API server
    tiers = {
        "gateway": run.bundle.helm_collector("gateway", HELM_VALUES["gateway"]),
        "agent": run.bundle.helm_collector(
            "agent",
            HELM_VALUES["agent"],
            names={GATEWAY_SERVICE: [ADDRESSES["gateway"]]},  # one gateway pod
            binds=agent_pod.binds,
            env=agent_pod.env,
        ),
    }
    try:
        for tier in tiers.values():
            tier.start()
        yield tiers
    finally:
        for tier in reversed(tiers.values()):
            tier.stop()


@pytest.mark.parametrize("name", sorted(HELM_PORTS))
def test_each_helm_collector_tier_listens_on_its_pod_address_only(
    helm_tiers: dict[str, Service], name: str
) -> None:
    found = check_on_its_address(helm_tiers[name], HELM_PORTS[name])
    report(f"helm {name} listens on {ADDRESSES[name]} (its pod IP) only: {_ports(found)}")
