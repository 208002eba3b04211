"""The binaries make e2e runs are the versions the bundle pins: the compose image tags, and for
the tools that have no image, the versions deploy/build/build-bundle names."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.e2e.bundle import BINARIES, ROOT, binary, compose_services

BUILD_BUNDLE = ROOT / "deploy" / "build" / "build-bundle"


#: The compose services built from source: not Grafana (no registry has it), nor those that run
#: llm-latency on Python's image (probe, advise).
BUILT = sorted(
    name
    for name, service in compose_services().items()
    if service["image"].rpartition(":")[0] in BINARIES
)


@pytest.mark.parametrize("service", BUILT)
def test_each_built_service_is_the_version_compose_pins(service: str) -> None:
    repository, _, tag = compose_services()[service]["image"].rpartition(":")
    output = subprocess.run(
        [binary(BINARIES[repository]), "--version"], capture_output=True, text=True, timeout=30
    )
    text = output.stdout + output.stderr
    versions = set(re.findall(r"\bv?(\d+\.\d+\.\d+)\b", text))
    assert tag.removeprefix("v") in versions, text


def build_bundle_version(name: str) -> str:
    """A tool's version as deploy/build/build-bundle writes it (``helm_version=4.3.2``)."""
    (version,) = re.findall(rf"^{name}_version=([0-9.]+)$", BUILD_BUNDLE.read_text(), re.M)
    return str(version)


def test_helm_is_the_version_build_bundle_pins() -> None:
    output = subprocess.run(
        [binary("helm"), "version", "--short"], capture_output=True, text=True, timeout=30
    )
    assert output.stdout.strip().split("+")[0] == f"v{build_bundle_version('helm')}", output


def test_kube_apiserver_is_the_version_its_wrapper_module_pins() -> None:
    go_mod = (ROOT / "deploy" / "build" / "kube-apiserver" / "go.mod").read_text()
    (version,) = re.findall(r"^\s*k8s\.io/kubernetes v(\d+\.\d+\.\d+)$", go_mod, re.M)
    output = subprocess.run(
        [binary("kube-apiserver"), "--version"], capture_output=True, text=True, timeout=30
    )
    assert output.stdout.strip() == f"Kubernetes v{version}", output
