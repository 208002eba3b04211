"""Helm and a real Kubernetes API server on loopback, for the probe chart (tests/e2e/test_helm.py).

``deploy/build/build-bundle`` builds ``helm`` (helm.sh/helm/v4) and ``kube-apiserver``
(k8s.io/kubernetes, through deploy/build/kube-apiserver/); etcd is Debian's ``etcd-server``
(.ci/run installs it). The API server is a control plane without nodes: objects are stored and
validated as in any cluster (schemas, names, admission), nothing is scheduled. It serves HTTPS
with a certificate it makes itself, and knows one client, ``e2e-admin`` in ``system:masters``,
by a static token.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.bundle import ADDRESSES, ROOT, Service, binary
from tests.e2e.chart import KUBERNETES_ATTRIBUTES_RULES

PROBE_CHART = ROOT / "deploy" / "helm" / "probe"
PRODUCTION_VALUES = ROOT / "tests" / "data" / "probe.production.values.yaml"

#: The Kubernetes versions the probe chart supports, oldest and newest (deploy/README.md,
#: "Scaling out with Helm"): kubernetes-validate's schemas span them, the API server is the newest.
KUBERNETES = ("1.25", "1.37")

ETCD_PORT = 2379
API_PORT = 6443


@dataclass
class Helm:
    """The built ``helm``, with its cache, configuration and data in a folder of the test's."""

    home: Path
    kubeconfig: Path | None = None

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        result = subprocess.run(
            [str(binary("helm")), *args], capture_output=True, text=True, env=env, timeout=120
        )
        if check and result.returncode != 0:
            pytest.fail(f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
        return result


def rendered(helm: Helm, values: Path, *args: str) -> list[dict[str, object]]:
    """The probe chart's manifests as ``helm template`` renders them with ``values``."""
    output = helm.run(
        "template", "llm-latency-probe", str(PROBE_CHART), "-f", str(values), *args
    ).stdout
    return [document for document in yaml.safe_load_all(output) if document]


def _key_pair(directory: Path) -> tuple[Path, Path]:
    """The service-account signing key pair the API server requires (RSA, by openssl)."""
    private, public = directory / "sa.key", directory / "sa.pub"
    subprocess.run(
        ["openssl", "genrsa", "-out", str(private), "2048"], check=True, capture_output=True
    )
    subprocess.run(
        ["openssl", "rsa", "-in", str(private), "-pubout", "-out", str(public)],
        check=True,
        capture_output=True,
    )
    return private, public


def _self_signed() -> ssl.SSLContext:
    """A TLS context that accepts the API server's own certificate (loopback only)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def control_plane(directory: Path) -> Cluster:
    """etcd and a kube-apiserver on their loopback addresses (not started), and a kubeconfig
    that reaches the API server as ``e2e-admin``."""
    etcd_binary = shutil.which("etcd")
    if etcd_binary is None:
        pytest.fail("etcd is not installed: .ci/run installs Debian's etcd-server")
    etcd_address, api_address = ADDRESSES["etcd"], ADDRESSES["kube-apiserver"]
    etcd_url = f"http://{etcd_address}:{ETCD_PORT}"
    etcd = Service(
        "etcd",
        [
            etcd_binary,
            "--name=e2e",
            f"--data-dir={directory / 'etcd-data'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://{etcd_address}:2380",
            f"--initial-advertise-peer-urls=http://{etcd_address}:2380",
            f"--initial-cluster=e2e=http://{etcd_address}:2380",
            f"--listen-metrics-urls=http://{etcd_address}:2381",
        ],
        {},
        directory / "etcd.log",
        f"http://{etcd_address}:2381/health",
    )
    token = secrets.token_hex(16)
    tokens = directory / "tokens.csv"
    tokens.write_text(f'{token},e2e-admin,e2e-admin,"system:masters"\n')
    private, public = _key_pair(directory)
    api_url = f"https://{api_address}:{API_PORT}"
    api = Service(
        "kube-apiserver",
        [
            str(binary("kube-apiserver")),
            f"--etcd-servers={etcd_url}",
            f"--bind-address={api_address}",
            f"--advertise-address={api_address}",
            f"--secure-port={API_PORT}",
            f"--cert-dir={directory / 'apiserver-certs'}",
            f"--token-auth-file={tokens}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={public}",
            f"--service-account-signing-key-file={private}",
            "--service-cluster-ip-range=10.96.0.0/16",
            # No controller keeps the kubernetes Service's endpoints: nothing connects to them.
            "--endpoint-reconciler-type=none",
            "--anonymous-auth=true",  # /readyz for the readiness wait, as in any cluster
        ],
        {},
        directory / "kube-apiserver.log",
        f"{api_url}/readyz",
        ready_context=_self_signed(),
    )
    kubeconfig = directory / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "e2e",
                        # The API server's own self-signed certificate.
                        "cluster": {"server": api_url, "insecure-skip-tls-verify": True},
                    }
                ],
                "users": [{"name": "e2e-admin", "user": {"token": token}}],
                "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e-admin"}}],
                "current-context": "e2e",
            }
        )
    )
    return Cluster(etcd, api, kubeconfig, directory / "apiserver-certs" / "apiserver.crt")


@dataclass
class Cluster:
    """The running control plane: its services, a kubeconfig and the admin's token."""

    etcd: Service
    api: Service
    kubeconfig: Path
    #: the API server's own serving certificate (and its CA), made at its first start
    certificate: Path

    def request(self, method: str, path: str, body: object = None) -> Any:
        """A call of the API server's REST API as ``e2e-admin``; the decoded JSON answer."""
        config = yaml.safe_load(self.kubeconfig.read_text())
        server = config["clusters"][0]["cluster"]["server"]
        token = config["users"][0]["user"]["token"]
        request = urllib.request.Request(
            server + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30, context=_self_signed()) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        self.api.stop()
        self.etcd.stop()


#: The node the agent runs on (the DaemonSet's K8S_NODE_NAME): k8s_attributes watches its pods.
NODE = "e2e-node"
#: The agent's release: its ServiceAccount and ClusterRole(Binding), as the chart names them.
AGENT = "llm-latency-agent"
NAMESPACE = "observability"


def _create(cluster: Cluster, path: str, body: dict[str, Any]) -> Any:
    try:
        return cluster.request("POST", path, body)
    except urllib.error.HTTPError as error:
        if error.code != 409:  # already there (another test made it)
            raise
        return None


def agent_access(
    cluster: Cluster, directory: Path
) -> tuple[list[tuple[Path, Path]], dict[str, str]]:
    """What the agent's pod has to reach the API server: the chart's ServiceAccount with its
    ClusterRole for presets.kubernetesAttributes (tests/e2e/chart.py), the account's token and
    the API server's certificate where every pod finds them (/run/secrets/kubernetes.io/
    serviceaccount, through a folder bound on /run), the API server's address in the two
    variables the kubelet sets, and the node name the DaemonSet passes.

    Returns the binds and the environment for ``Bundle.helm_collector``."""
    _create(cluster, "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    _create(
        cluster, f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", {"metadata": {"name": AGENT}}
    )
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    _create(
        cluster,
        f"{rbac}/clusterroles",
        {"metadata": {"name": AGENT}, "rules": KUBERNETES_ATTRIBUTES_RULES},
    )
    _create(
        cluster,
        f"{rbac}/clusterrolebindings",
        {
            "metadata": {"name": AGENT},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": AGENT,
            },
            "subjects": [{"kind": "ServiceAccount", "name": AGENT, "namespace": NAMESPACE}],
        },
    )
    token = cluster.request(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{AGENT}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )["status"]["token"]
    run = directory / "agent-run"
    account = run / "secrets" / "kubernetes.io" / "serviceaccount"
    account.mkdir(parents=True, exist_ok=True)
    (account / "token").write_text(token)
    (account / "namespace").write_text(NAMESPACE)
    shutil.copy(cluster.certificate, account / "ca.crt")
    env = {
        "KUBERNETES_SERVICE_HOST": ADDRESSES["kube-apiserver"],
        "KUBERNETES_SERVICE_PORT": str(API_PORT),
        "K8S_NODE_NAME": NODE,
    }
    return [(run, Path("/run"))], env
