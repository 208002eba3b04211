"""The probe chart's values.schema.json (deploy/helm/probe) rejects, before anything is rendered,
the values the API server would reject once rendered: a region's name goes into metadata.name
(``<release>-<region>``, an RFC 1123 subdomain) and into the label ``llm-latency/region``, the
keys Secret's name is a reference the API server checks, node selectors are labels.

``helm`` applies the schema on lint, template and install (tests/e2e/test_helm.py runs it, and
installs into a real API server); this checks the schema itself with jsonschema, as Helm reads it
(draft 7), so that it runs without a Helm build.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "probe"
PRODUCTION = ROOT / "tests" / "data" / "probe.production.values.yaml"


def errors(values: dict[str, Any]) -> list[str]:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)
    return [error.message for error in validator.iter_errors(values)]


def defaults() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


@pytest.mark.parametrize("path", [CHART / "values.yaml", PRODUCTION], ids=["default", "production"])
def test_the_chart_defaults_and_production_like_values_pass(path: Path) -> None:
    assert errors(yaml.safe_load(path.read_text())) == []


@pytest.mark.parametrize(
    "region",
    [
        "EU_West",  # upper case and '_': not a DNS subdomain (metadata.name)
        "eu-west-",  # ends with '-'
        "-eu-west",
        "eu west",
        "eu..west",
        "eu-west." + "x" * 60,  # a valid subdomain, too long for a label value (63)
        "",
    ],
)
def test_a_region_name_the_api_server_would_reject_is_rejected(region: str) -> None:
    values = defaults()
    values["regions"][0]["name"] = region
    assert errors(values), region


@pytest.mark.parametrize("region", ["eu-west-1", "us.east.1", "r1", "a" * 63])
def test_region_names_that_are_valid_names_and_label_values_pass(region: str) -> None:
    values = defaults()
    values["regions"][0]["name"] = region
    assert errors(values) == []


def _set(values: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(values)
    node = changed
    *parents, last = path.split(".")
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[last] = value
    return changed


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("keysSecret", "Keys_Secret"),  # envFrom.secretRef.name: a DNS subdomain
        ("regions.0.nodeSelector", {"topology.kubernetes.io/region": "eu west"}),
        ("regions.0.nodeSelector", {"Topology.io/region": "eu-west-1"}),  # key prefix
        ("image.pullPolicy", "always"),
        ("resources", {"requests": {"memory": "96 MB"}}),
        ("monitor.every", "1 minute"),
        ("monitor.jitter", 1),
        ("regions", []),
        ("endpoints.0.url", "api.openai.com"),
        ("image.tagg", "0.1.0"),  # a misspelt key is not silently ignored
    ],
)
def test_other_values_that_would_fail_are_rejected(path: str, value: Any) -> None:
    assert errors(_set(defaults(), path, value)), (path, value)
