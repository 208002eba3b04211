"""The wheel's metadata: ranges rather than pins, the API-only core, the SDK and exporters in
extras, the Apache-2.0 licence as an SPDX expression with its text included, and the oldest
set CI tests (constraints/oldest.txt) at the lower bounds the wheel claims."""

from __future__ import annotations

import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.wheel_build import build_wheel

# One worker builds the wheel (two builds at once would share the source tree's build/).
pytestmark = pytest.mark.xdist_group("wheel")

ROOT = Path(__file__).resolve().parent.parent
OLDEST = ROOT / "constraints" / "oldest.txt"
CORE = {
    "opentelemetry-api",
    "opentelemetry-instrumentation",
    "opentelemetry-semantic-conventions",
    "opentelemetry-util-http",
    "wrapt",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(archive.read(name).decode())


def requirements(metadata: Message) -> list[Requirement]:
    return [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]


def extras_of(requirement: Requirement) -> set[str]:
    """The extras whose marker selects the requirement; empty for a core dependency."""
    marker = requirement.marker
    if marker is None:
        return set()
    names = {e for e in str(marker).replace('"', " ").split() if e.isidentifier()} - {"extra"}
    # On any Python: a requirement of an extra for older Pythons only (tomli) is still the
    # extra's.
    return {
        e
        for e in names
        if any(marker.evaluate({"extra": e, "python_version": v}) for v in ("3.10", "3.13"))
    }


def test_every_dependency_is_a_range_with_a_lower_bound(metadata: Message) -> None:
    for requirement in requirements(metadata):
        if requirement.name == "llm-latency":
            continue  # an extra naming others
        operators = {spec.operator for spec in requirement.specifier}
        assert "==" not in operators and "===" not in operators, requirement
        assert ">=" in operators, f"{requirement}: no lower bound"


def test_the_core_is_the_opentelemetry_api_and_its_helpers_only(metadata: Message) -> None:
    core = {r.name for r in requirements(metadata) if not extras_of(r)}
    assert core == CORE


def test_the_sdk_and_exporters_are_extras(metadata: Message) -> None:
    by_extra: dict[str, set[str]] = {}
    for requirement in requirements(metadata):
        for extra in extras_of(requirement):
            by_extra.setdefault(extra, set()).add(requirement.name)
    assert by_extra["otlp"] == {"opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"}
    assert by_extra["grpc"] == {"opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-grpc"}
    grpc_users = {
        e for e, names in by_extra.items() if "opentelemetry-exporter-otlp-proto-grpc" in names
    }
    assert grpc_users == {"grpc"}  # the test extra names [grpc], not the package
    assert {"aiohttp", "httpx", "httpx2", "requests", "cli", "test"} <= set(by_extra)


def test_licence_is_an_spdx_expression_with_its_text(wheel: Path, metadata: Message) -> None:
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["License"] is None
    assert not [c for c in metadata.get_all("Classifier") or [] if c.startswith("License ::")]
    assert "Typing :: Typed" in (metadata.get_all("Classifier") or [])
    assert metadata.get_all("License-File") == ["LICENSE"]
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (licence,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        text = archive.read(licence).decode()
        assert "llm_latency/py.typed" in names
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert text == (ROOT / "LICENSE").read_text()


def test_the_oldest_set_is_at_the_claimed_lower_bounds(metadata: Message) -> None:
    """Each package constraints/oldest.txt holds at one version is at the wheel's lower bound
    for it (a ``>=`` the oldest set does not test would be a claim nothing checks)."""
    lower: dict[str, Version] = {}
    for requirement in requirements(metadata):
        for spec in requirement.specifier:
            if spec.operator == ">=":
                lower[requirement.name.lower()] = Version(spec.version)
    pinned = {}
    for line in OLDEST.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        (spec,) = requirement.specifier
        if spec.operator == "==":
            pinned[requirement.name.lower()] = Version(spec.version)
    assert set(CORE) <= set(pinned)
    for name, version in pinned.items():
        if name in lower:
            assert version == lower[name], (
                f"{name}: oldest.txt {version}, lower bound {lower[name]}"
            )
