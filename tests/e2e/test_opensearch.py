"""Jaeger on OpenSearch as deploy/helm/jaeger.values.yaml runs it: the values' ``userconfig``
(Jaeger's own configuration, OpenSearch storage with its index prefix, shards and replicas) in
two Jaeger replicas sharing one OpenSearch, and the chart's index cleaner job with its
``INDEX_PREFIX``.

OpenSearch 2.19.6 runs from its Maven Central jars (deploy/build/opensearch/: a launcher that
starts a node with the Netty4 plugin; 512 MB of heap), one node: the values' one replica per
shard stays unassigned (the cluster is yellow), as it would on a one-node cluster. Each Jaeger
runs the userconfig unmodified but for its listening addresses: ``0.0.0.0`` (and the query
service's all-interfaces default) becomes the replica's own loopback address (its pod IP); the
values' OpenSearch Service name resolves to the node through the replica's hosts file.
"""

from __future__ import annotations

import datetime
import json
import os
import secrets
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.bundle import (
    ADDRESSES,
    HELM,
    Service,
    _namespace_prefix,
    binary,
    get_json,
    hosts_file,
    otlp_trace_body,
    wait_for,
)
from tests.e2e.conftest import report

VALUES = HELM / "jaeger.values.yaml"
REPLICAS = ("jaeger-os-1", "jaeger-os-2")
#: The chart's Secret jaeger-opensearch, as the values' extraEnv read it (OpenSearch without
#: its security plugin takes any).
CREDENTIALS = {"ES_USERNAME": "jaeger", "ES_PASSWORD": "a password from the Secret"}


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(VALUES.read_text())
    return loaded


def opensearch_url() -> str:
    return f"http://{ADDRESSES['opensearch']}:9200"


def opensearch(method: str, path: str, body: object = None) -> Any:
    request = urllib.request.Request(
        opensearch_url() + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        pytest.fail(f"OpenSearch {method} {path}: {error.code} {error.read().decode()}")


def _opensearch_service(directory: Path) -> Service:
    lib = binary("opensearch") / "lib"
    home = directory / "opensearch-home"
    home.mkdir()
    address = ADDRESSES["opensearch"]
    command = [
        "java",
        "-Xms512m",
        "-Xmx512m",
        "-cp",
        f"{lib}/*",
        "llmlatency.OpenSearchLauncher",
        f"path.home={home}",
        f"path.data={home / 'data'}",
        f"path.logs={home / 'logs'}",
        "cluster.name=e2e",
        "node.name=e2e-1",
        "discovery.type=single-node",
        f"network.host={address}",
        "http.port=9200",
        "transport.port=9300",
    ]
    return Service(
        "opensearch",
        command,
        {},
        directory / "opensearch.log",
        f"http://{address}:9200/_cluster/health?wait_for_status=yellow&timeout=1s",
    )


def _jaeger_replica(directory: Path, name: str) -> Service:
    """A Jaeger replica running the values' userconfig, on its own address."""
    address = ADDRESSES[name]
    userconfig = values()["userconfig"]
    # jaeger_query listens on all interfaces by default (:16686, :16685): on its address here
    query = userconfig["extensions"]["jaeger_query"]
    query["http"] = {"endpoint": f"{address}:16686"}
    query["grpc"] = {"endpoint": f"{address}:16685"}
    config = yaml.safe_dump(userconfig).replace("0.0.0.0:", f"{address}:")
    config = config.replace("host: 0.0.0.0", f"host: {address}")
    path = directory / f"{name}.config.yaml"
    path.write_text(config)
    command = [
        *_namespace_prefix([(hosts_file(directory, name), Path("/etc/hosts"))]),
        str(binary("jaeger")),
        f"--config={path}",
    ]
    return Service(
        name,
        command,
        dict(CREDENTIALS),
        directory / f"{name}.log",
        f"http://{address}:13133/status",
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("opensearch")
    services = [_opensearch_service(directory)]
    services += [_jaeger_replica(directory, name) for name in REPLICAS]
    try:
        services[0].start(timeout=180)
        for replica in services[1:]:
            replica.start(timeout=120)
        yield directory
    finally:
        for service in reversed(services):
            service.stop()


def test_a_trace_written_through_one_replica_is_read_through_the_other(stack: Path) -> None:
    trace_id = secrets.token_hex(16)
    request = urllib.request.Request(
        f"http://{ADDRESSES[REPLICAS[0]]}:4318/v1/traces",
        data=json.dumps(
            otlp_trace_body(
                trace_id,
                {"service.name": "e2e-os"},
                name="chat gpt-4o-mini",
                kind=3,
                duration_ns=250_000_000,
            )
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=10).close()
    url = f"http://{ADDRESSES[REPLICAS[1]]}:16686/api/traces/{trace_id}"
    answer = wait_for(lambda: get_json(url)["data"], timeout=60, interval=1, what="the trace")
    assert [span["operationName"] for span in answer[0]["spans"]] == ["chat gpt-4o-mini"]
    report("Jaeger on OpenSearch: a trace written through one replica, read through the other")


def _indices() -> dict[str, dict[str, Any]]:
    listed = opensearch("GET", "/_cat/indices?format=json")
    return {index["index"]: index for index in listed}


def test_the_indices_are_the_values_prefix_shards_and_replicas(stack: Path) -> None:
    wait_for(
        lambda: any(name.startswith("llm-latency-jaeger-span-") for name in _indices()),
        timeout=60,
        what="Jaeger's span index",
    )
    storage = values()["userconfig"]["extensions"]["jaeger_storage"]["backends"]["primary_store"]
    indices = storage["opensearch"]["indices"]
    prefix = indices["index_prefix"]
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    for kind, key in (("span", "spans"), ("service", "services")):
        name = f"{prefix}-jaeger-{kind}-{today}"
        settings = opensearch("GET", f"/{name}/_settings")[name]["settings"]["index"]
        assert int(settings["number_of_shards"]) == indices[key]["shards"], name
        assert int(settings["number_of_replicas"]) == indices[key]["replicas"], name


def _cleaner(stack: Path, days: int) -> None:
    """The chart's esIndexCleaner job: its URL (storage.elasticsearch.url) and extraEnv."""
    chart = values()
    env = {
        entry["name"]: entry.get("value") or CREDENTIALS[entry["name"]]
        for entry in chart["esIndexCleaner"]["extraEnv"]
    }
    command = [
        *_namespace_prefix([(hosts_file(stack, "es-index-cleaner"), Path("/etc/hosts"))]),
        str(binary("es-index-cleaner")),
        str(days),
        chart["storage"]["elasticsearch"]["url"],
    ]
    result = subprocess.run(
        command, env={**os.environ, **env}, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_the_index_cleaner_deletes_by_the_charts_prefix(stack: Path) -> None:
    """The cleaner deletes the indices with its prefix created before its cutoff (midnight
    tonight, less the days to keep): the chart's 7 days keep today's; 0 days deletes them, and
    leaves another prefix's (an index of a Jaeger without the prefix) alone."""
    cleaner = values()["esIndexCleaner"]
    (prefix,) = [e["value"] for e in cleaner["extraEnv"] if e["name"] == "INDEX_PREFIX"]
    wait_for(
        lambda: f"{prefix}-jaeger-service-" in " ".join(_indices()),
        timeout=60,
        what="Jaeger's indices",
    )
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    others = f"jaeger-span-{today}"
    opensearch("PUT", f"/{others}", {"settings": {"index": {"number_of_replicas": 0}}})
    ours = {name for name in _indices() if name.startswith(f"{prefix}-jaeger-")}
    assert len(ours) == 2  # span and service

    _cleaner(stack, cleaner["numberOfDays"])  # the nightly job: 7 days
    assert ours | {others} <= set(_indices())

    _cleaner(stack, 0)  # 0 days: today's too
    after = set(_indices())
    assert not ours & after, after
    assert others in after
    report(
        f"Jaeger's index cleaner (INDEX_PREFIX={prefix}): kept today's indices at"
        f" {cleaner['numberOfDays']} days; at 0, deleted {', '.join(sorted(ours))}, kept {others}"
    )
