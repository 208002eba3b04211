"""The probe chart (deploy/helm/probe) as an operator meets it: ``helm lint --strict``, ``helm
template`` validated against the strict Kubernetes schemas of the oldest and newest supported
Kubernetes (the PyPI package kubernetes-validate, offline), with the chart's defaults and with
production-like values
(tests/data/probe.production.values.yaml).

A region named ``EU_West`` renders, passes the Kubernetes schemas (they carry no name patterns)
and was refused only by the API server (``metadata.name`` must be an RFC 1123 subdomain); the
chart's values.schema.json now refuses it before anything is rendered or sent. ``helm install
--dry-run=server`` let the same name through: the install here is a real one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import tomllib
import yaml
from llm_latency.cli.monitor_config import parse_config
from tests.e2e.conftest import report

from tests.e2e.kube import KUBERNETES, PROBE_CHART, PRODUCTION_VALUES, Helm, rendered

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
