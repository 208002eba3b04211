"""The agent's k8s_attributes (presets.kubernetesAttributes in
deploy/helm/otel-collector-agent.values.yaml) reading a real API server under the chart's RBAC:
a program's spans leave the agent with its pod's name, namespace and node.

The agent and gateway run the configurations the chart renders from their values
(tests/e2e/chart.py, reconstructed); the agent's pod is a service account token, the API
server's certificate and its address (tests/e2e/kube.py, ``agent_access``). The program's pod is
a Pod object on the agent's node, its IP set through the status subresource as the kubelet
would: no node runs it, the agent only looks it up.
"""

from __future__ import annotations

import json
import secrets
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.bundle import (
    ADDRESSES,
    GATEWAY_SERVICE,
    HELM,
    Service,
    get_json,
    otlp_trace_body,
    wait_for,
)
from tests.e2e.conftest import AgentPod, Run, report
from tests.e2e.kube import NODE, Cluster

POD = {"namespace": "llm-apps", "name": "chat-app-5d8f9c7b4-x2x7q", "ip": "10.42.0.17"}
SERVICE = "e2e-k8s-attributes"


@pytest.fixture(scope="module")
def program_pod(cluster: Cluster) -> dict[str, Any]:
    namespace, name = POD["namespace"], POD["name"]
    cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    # the namespace's default service account, which no controller manager makes here: the
    # ServiceAccount admission refuses a pod without it
    cluster.request(
        "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "default"}}
    )
    pods = f"/api/v1/namespaces/{namespace}/pods"
    pod = cluster.request(
        "POST",
        pods,
        {
            "metadata": {"name": name, "labels": {"app": "chat-app"}},
            "spec": {
                "nodeName": NODE,
                "containers": [{"name": "app", "image": "registry.example.com/chat-app:1.4.2"}],
            },
        },
    )
    pod["status"] = {"phase": "Running", "podIP": POD["ip"], "podIPs": [{"ip": POD["ip"]}]}
    stored: dict[str, Any] = cluster.request("PUT", f"{pods}/{name}/status", pod)
    assert stored["status"]["podIP"] == POD["ip"]
    return stored


@pytest.fixture(scope="module")
def tiers(run: Run, agent_pod: AgentPod, program_pod: dict[str, Any]) -> Iterator[Service]:
    gateway = run.bundle.helm_collector(
        "gateway",
        HELM / "otel-collector-gateway.values.yaml",
        ["processors::tail_sampling::decision_wait=2s"],
    )
    agent = run.bundle.helm_collector(
        "agent",
        HELM / "otel-collector-agent.values.yaml",
        names={GATEWAY_SERVICE: [ADDRESSES["gateway"]]},  # one gateway pod
        binds=agent_pod.binds,
        env=agent_pod.env,
    )
    try:
        gateway.start()
        agent.start()
        yield agent
    finally:
        agent.stop()
        gateway.stop()


def _send_failed_call(trace_id: str) -> None:
    """One failed call's span (the gateway keeps errors) from a program whose resource names
    its pod's IP, as the Downward API gives it (k8s.pod.ip)."""
    resource = {"service.name": SERVICE, "k8s.pod.ip": POD["ip"]}
    body = otlp_trace_body(trace_id, resource, name="chat gpt-4o-mini", kind=3,
                           duration_ns=120_000_000, error=True)  # fmt: skip
    request = urllib.request.Request(
        f"http://{ADDRESSES['agent']}:4318/v1/traces",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=10).close()


def _process_tags(run: Run, trace_id: str) -> dict[str, Any]:
    answer = get_json(run.bundle.url("jaeger", 16686, f"/api/traces/{trace_id}"))
    (trace,) = answer["data"]
    (process,) = trace["processes"].values()
    return {tag["key"]: tag["value"] for tag in process["tags"]}


def test_the_agent_adds_the_programs_pod_from_the_api_server(run: Run, tiers: Service) -> None:
    # The agent's pod cache fills once its first list of the node's pods returns: a span sent
    # before then passes without the attributes (passthrough: false does not wait). Each
    # attempt is a trace of its own; the last must carry them.
    def attributed() -> dict[str, Any] | None:
        trace_id = secrets.token_hex(16)
        _send_failed_call(trace_id)
        tags: dict[str, Any] = wait_for(
            lambda: _process_tags(run, trace_id), timeout=30, interval=1, what="the trace"
        )
        return tags if "k8s.pod.name" in tags else None

    tags = wait_for(attributed, timeout=90, interval=2, what="k8s attributes on a trace")
    assert tags["k8s.pod.name"] == POD["name"]
    assert tags["k8s.namespace.name"] == POD["namespace"]
    assert tags["k8s.node.name"] == NODE
    assert tags["k8s.pod.ip"] == POD["ip"]
    assert "Forbidden" not in tiers.tail(200)
    report(
        f"k8s_attributes: the agent read pod {POD['namespace']}/{POD['name']} from the API"
        f" server under the chart's ClusterRole; its spans carry k8s.pod.name, k8s.node.name"
    )
