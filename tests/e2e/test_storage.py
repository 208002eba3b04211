"""Jaeger's storage as the compose configuration sets it: Badger, in the jaeger-data volume,
with a retention of 7 days that Jaeger loads and honours.

A trace outliving a restart of Jaeger is checked under traffic in tests/e2e/test_faults.py.
Seven days cannot be waited for: a second Jaeger runs the same configuration with the retention
shortened by Jaeger's own ``--set``, and forgets a trace when it ends.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llm_latency.jaeger_query import since_seconds
from tests.e2e.bundle import Service, binary, otlp_trace_body, wait_for
from tests.e2e.conftest import Run, report

#: The short retention of the second Jaeger: long enough to see the trace on a loaded machine.
SHORT_TTL_S = 30
TTL_SETTING = "extensions::jaeger_storage::backends::traces_store::badger::ttl::spans"


#: ``${env:NAME}`` and ``${env:NAME:-default}``, the forms of the bundle's configurations.
_ENV = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def loaded_config(service: Service) -> dict[str, Any]:
    """The configuration Jaeger loads from ``service``'s command line and environment: its
    ``--config`` file with each ``${env:NAME:-default}`` resolved from the service's
    environment, then each ``--set=a::b::c=value`` applied, as the collector's configuration
    providers do for those forms. (Jaeger 2.12.0's ``print-config``, which showed it, is
    experimental: behind a feature gate, with which it panics.)"""
    jaeger = str(binary("jaeger"))
    arguments = service.command[service.command.index(jaeger) + 1 :]
    environment = {**os.environ, **service.env}
    (path,) = [a.removeprefix("--config=") for a in arguments if a.startswith("--config=")]
    text = _ENV.sub(lambda m: environment.get(m.group(1), m.group(2) or ""), Path(path).read_text())
    config: dict[str, Any] = yaml.safe_load(text)
    for setting in (a.removeprefix("--set=") for a in arguments if a.startswith("--set=")):
        keys, _, value = setting.partition("=")
        *parents, last = keys.split("::")
        node = config
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = yaml.safe_load(value)
    return config


def traces_store(config: dict[str, Any]) -> dict[str, Any]:
    """The Badger settings of the backend Jaeger writes the traces to."""
    name = config["exporters"]["jaeger_storage_exporter"]["trace_storage"]
    backend = config["extensions"]["jaeger_storage"]["backends"][name]
    badger: dict[str, Any] | None = backend["badger"]
    assert badger is not None, backend
    return badger


def test_jaeger_runs_badger_in_the_volume_with_7_days_of_retention_and_synced_writes(
    run: Run,
) -> None:
    badger = traces_store(loaded_config(run.jaeger))
    assert badger["ephemeral"] is False
    assert badger["consistency"] is True
    assert since_seconds(badger["ttl"]["spans"]) == 7 * 24 * 3600
    volume = run.bundle.volume("jaeger", "jaeger-data")
    for kind in ("keys", "values"):
        folder = Path(badger["directories"][kind])
        assert folder.is_relative_to(volume), (folder, volume)
        assert any(folder.iterdir()), f"Badger wrote nothing in {folder}"


def otlp_trace(service: str) -> tuple[str, bytes]:
    """A new trace of one span from ``service``: its id, and the OTLP/HTTP JSON request body."""
    trace_id = secrets.token_hex(16)
    body = otlp_trace_body(trace_id, {"service.name": service}, name="retention", kind=1,
                           duration_ns=1_000_000)  # fmt: skip
    return trace_id, json.dumps(body).encode()


def trace_found(url: str) -> bool:
    """Whether Jaeger's query API has the trace at ``url`` (it answers 404 for one it has not)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return bool(json.loads(response.read())["data"])
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return False
        raise


@dataclass(frozen=True)
class Answer:
    """One question to Jaeger's query API and its answer, between two readings of the wall clock
    (``time.time()``, the clock Jaeger's ``time.Now()`` reads): Jaeger looked at its database at
    an instant between ``asked`` and ``answered``."""

    asked: float
    answered: float
    found: bool


def ask(url: str) -> Answer:
    asked = time.time()
    found = trace_found(url)
    return Answer(asked, time.time(), found)


def test_jaeger_forgets_a_trace_when_its_retention_ends(run: Run) -> None:
    """Badger's retention is on the wall clock: Jaeger's writer gives each entry the expiry
    ``time.Now().Add(ttl).Unix()`` (whole seconds) at the write, and Badger hides an entry once
    ``time.Now().Unix() >= expiry``. The write comes after the request is sent and before the
    first answer that shows the trace, so the expiry is within whole seconds of those two
    instants plus the ttl; every answer is held to that, on the same clock. The test's
    monotonic clock is no measure of it: it can count less than the wall clock (the wall clock
    set forward, a virtual machine paused and its wall clock set again on resume). A check of
    ``time.monotonic()`` against the ttl saw the trace gone 21.3 s after the send in a loaded
    run: as the write follows the send and Jaeger's reads filter on nothing else, the wall
    clock had gained 8 s or more on the monotonic one."""
    jaeger = run.bundle.compose_service(
        "jaeger-ttl", like="jaeger", overrides=[f"{TTL_SETTING}={SHORT_TTL_S}s"]
    )
    jaeger.start()
    answers: list[Answer] = []

    def gone() -> bool:
        answers.append(ask(url))
        return not answers[-1].found

    try:
        assert since_seconds(traces_store(loaded_config(jaeger))["ttl"]["spans"]) == SHORT_TTL_S
        trace_id, body = otlp_trace("e2e-retention")
        request = urllib.request.Request(
            run.bundle.url("jaeger-ttl", 4318, "/v1/traces"),
            body,
            {"Content-Type": "application/json"},
        )
        url = run.bundle.url("jaeger-ttl", 16686, f"/api/traces/{trace_id}")
        sent, sent_monotonic = time.time(), time.monotonic()
        urllib.request.urlopen(request, timeout=10).close()
        first = wait_for(
            lambda: (answer := ask(url)).found and answer,
            timeout=SHORT_TTL_S / 2,
            interval=0.5,
            what="the trace",
        )
        wait_for(gone, timeout=3 * SHORT_TTL_S, interval=0.5, what="the trace to expire")
        gone_monotonic = time.monotonic() - sent_monotonic
    finally:
        jaeger.stop()
    # The expiry, in whole seconds of the wall clock, is no sooner than the send plus the ttl
    # and no later than the first answer that showed the trace plus the ttl.
    earliest, latest = math.floor(sent + SHORT_TTL_S), math.floor(first.answered + SHORT_TTL_S)
    found = [first, *(a for a in answers if a.found)]
    expired = answers[-1]
    clocks = (
        f"sent at {sent:.3f} (wall clock), shown at {first.answered:.3f}, so expiry in"
        f" [{earliest}, {latest}]; last shown asked at {found[-1].asked:.3f}, gone answered at"
        f" {expired.answered:.3f}, {expired.answered - sent:.1f} s after the send on the wall"
        f" clock, {gone_monotonic:.1f} s on the monotonic clock"
    )
    assert expired.answered >= earliest, f"the trace was gone before its retention: {clocks}"
    assert found[-1].asked < latest, f"the trace was kept after its retention: {clocks}"
    report(
        f"Jaeger retention {SHORT_TTL_S} s: a trace shown {first.answered - sent:.1f} s after it"
        f" was sent, gone {expired.answered - sent:.0f} s after (wall clock, as Badger's expiry;"
        f" {gone_monotonic:.0f} s monotonic); the compose configuration loads 168h"
    )
