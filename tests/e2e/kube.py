"""Helm, for the probe chart (tests/e2e/test_helm.py).

``deploy/build/build-bundle`` builds ``helm`` (helm.sh/helm/v4) and ``kube-apiserver``
(k8s.io/kubernetes, through deploy/build/kube-apiserver/); etcd is Debian's ``etcd-server``
(.ci/run installs it). The API server is a control plane without nodes: objects are stored and
validated as in any cluster (schemas, names, admission), nothing is scheduled. It serves HTTPS
with a certificate it makes itself, and knows one client, ``e2e-admin`` in ``system:masters``,
by a static token.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from tests.e2e.bundle import ROOT, binary

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
