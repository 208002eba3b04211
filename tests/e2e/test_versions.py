"""The binaries make e2e runs are the versions the bundle pins: the compose image tags."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.e2e.bundle import BINARIES, binary, compose_services


@pytest.mark.parametrize("service", sorted(set(compose_services()) - {"grafana", "probe"}))
def test_each_built_service_is_the_version_compose_pins(service: str) -> None:
    repository, _, tag = compose_services()[service]["image"].rpartition(":")
    output = subprocess.run(
        [binary(BINARIES[repository]), "--version"], capture_output=True, text=True, timeout=30
    )
    text = output.stdout + output.stderr
    versions = set(re.findall(r"\bv?(\d+\.\d+\.\d+)\b", text))
    assert tag.removeprefix("v") in versions, text
