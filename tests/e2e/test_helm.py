"""The probe chart (deploy/helm/probe) as an operator meets it: ``helm lint --strict``, ``helm
template`` validated against the strict Kubernetes schemas of the oldest and newest supported
Kubernetes (the PyPI package kubernetes-validate, offline), and ``helm install`` into a real
kube-apiserver, with the chart's defaults and with production-like values
(tests/data/probe.production.values.yaml).

A region named ``EU_West`` renders, passes the Kubernetes schemas (they carry no name patterns)
and was refused only by the API server (``metadata.name`` must be an RFC 1123 subdomain); the
chart's values.schema.json now refuses it before anything is rendered or sent. The install here
is a real one: ``helm install --dry-run=server`` was seen (issue 52) to let the same name
through.
"""

from __future__ import annotations

import urllib.error
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import tomllib
import yaml

from llm_latency.cli.monitor_config import parse_config
from tests.e2e.bundle import ROOT, wait_for
from tests.e2e.conftest import report
from tests.e2e.kube import (
    KUBERNETES,
    PROBE_CHART,
    PRODUCTION_VALUES,
    Cluster,
    Helm,
    rendered,
)

PODMONITOR_CRD = ROOT / "tests" / "data" / "podmonitor.crd.yaml"
AGENT_VALUES = ROOT / "deploy" / "helm" / "otel-collector-agent.values.yaml"

VALUES = {"default": PROBE_CHART / "values.yaml", "production": PRODUCTION_VALUES}


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(tmp_path_factory.mktemp("helm"))


@pytest.mark.parametrize("values", sorted(VALUES))
def test_the_chart_lints_strictly(helm: Helm, values: str) -> None:
    result = helm.run("lint", "--strict", str(PROBE_CHART), "-f", str(VALUES[values]))
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout, result.stdout


@pytest.mark.parametrize("kubernetes", KUBERNETES)
@pytest.mark.parametrize("values", sorted(VALUES))
def test_the_rendered_manifests_are_valid_kubernetes(
    helm: Helm, values: str, kubernetes: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    documents = rendered(helm, VALUES[values], "--kube-version", f"{kubernetes}.0")
    regions = [region["name"] for region in _values(VALUES[values])["regions"]]
    kinds = sorted((str(d["kind"]), _name(d)) for d in documents)
    assert kinds == sorted(
        (kind, f"llm-latency-probe-{region}")
        for region in regions
        for kind in ("ConfigMap", "Deployment")
    )
    for document in documents:
        # strict: an unknown field (a misplaced key) fails too
        kubernetes_validate.validate(document, kubernetes, strict=True)
    # and the probe reads the config file each ConfigMap carries, with the keys the Secret gives
    for endpoint in _values(VALUES[values])["endpoints"]:
        if "api_key_env" in endpoint:
            monkeypatch.setenv(endpoint["api_key_env"], "a key from the Secret")
    for document in documents:
        if document["kind"] == "ConfigMap":
            data: Any = document["data"]
            config = parse_config(tomllib.loads(data["endpoints.toml"]))
            assert len(config.endpoints) == len(_values(VALUES[values])["endpoints"])


def test_a_region_name_the_api_server_refuses_is_refused_by_the_schema(helm: Helm) -> None:
    for command in (("lint",), ("template", "llm-latency-probe")):
        result = helm.run(
            *command, str(PROBE_CHART), "--set", "regions[0].name=EU_West", check=False
        )
        assert result.returncode != 0, command
        assert "values don't meet the specifications of the schema" in result.stderr + result.stdout
        assert "/regions/0/name" in result.stderr + result.stdout
    report("probe chart: EU_West refused by values.schema.json on lint and template")


def _values(path: Path) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(path.read_text())
    return values


def _name(document: dict[str, Any]) -> str:
    return str(document["metadata"]["name"])


# -- installed into a real API server --------------------------------------------------------


@pytest.fixture(scope="module")
def installer(helm: Helm, cluster: Cluster) -> Helm:
    return Helm(helm.home, cluster.kubeconfig)


@pytest.mark.parametrize("values", sorted(VALUES))
def test_the_chart_installs_into_a_real_api_server(
    installer: Helm, cluster: Cluster, values: str
) -> None:
    namespace = f"probe-{values}"
    installer.run(
        "install",
        "llm-latency-probe",
        str(PROBE_CHART),
        "-f",
        str(VALUES[values]),
        "--namespace",
        namespace,
        "--create-namespace",
        "--wait=false",
    )
    regions = [region["name"] for region in _values(VALUES[values])["regions"]]
    for kind, path in (("Deployment", "apis/apps/v1"), ("ConfigMap", "api/v1")):
        listed = cluster.request("GET", f"/{path}/namespaces/{namespace}/{kind.lower()}s")
        names = {item["metadata"]["name"] for item in listed["items"]}
        assert {f"llm-latency-probe-{region}" for region in regions} <= names, kind
    status = installer.run("status", "llm-latency-probe", "--namespace", namespace).stdout
    assert "STATUS: deployed" in status
    report(f"probe chart ({values} values): installed into kube-apiserver, {len(regions)} regions")


def test_the_api_server_refuses_the_bad_region_the_schema_refuses(installer: Helm) -> None:
    bad = ("--set", "regions[0].name=EU_West", "--namespace", "probe-bad", "--create-namespace")
    refused = installer.run("install", "bad", str(PROBE_CHART), *bad, check=False)
    assert refused.returncode != 0
    assert "/regions/0/name" in refused.stderr, refused.stderr
    # The same values without the schema: what the API server says of them.
    unchecked = installer.run(
        "install", "bad", str(PROBE_CHART), *bad, "--skip-schema-validation", check=False
    )
    assert unchecked.returncode != 0
    assert "RFC 1123 subdomain" in unchecked.stderr, unchecked.stderr
    report("probe chart: EU_West refused by the schema, and by the API server without it")


def test_the_podmonitor_of_the_agent_values_is_stored(cluster: Cluster) -> None:
    """The PodMonitor CRD (a reduced copy: tests/data/podmonitor.crd.yaml), then the agent's
    PodMonitor as collector chart 0.170.0 renders it from the values' ``podMonitor``."""
    crd = yaml.safe_load(PODMONITOR_CRD.read_text())
    cluster.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    monitor = yaml.safe_load(AGENT_VALUES.read_text())["podMonitor"]
    body = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": "llm-latency-agent-agent", "labels": monitor["extraLabels"]},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/instance": "llm-latency-agent"}},
            "podMetricsEndpoints": monitor["metricsEndpoints"],
        },
    }
    path = "/apis/monitoring.coreos.com/v1/namespaces/default/podmonitors"

    def created() -> Any:
        try:
            return cluster.request("POST", path, body)
        except urllib.error.HTTPError as error:
            if error.code == 404:  # the CRD is not served yet
                return None
            raise

    stored = wait_for(created, timeout=30, interval=0.5, what="the PodMonitor CRD")
    assert stored["spec"]["podMetricsEndpoints"] == monitor["metricsEndpoints"]
