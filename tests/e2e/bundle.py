"""The deploy bundle's services, run for real as processes on loopback.

``deploy/build/build-bundle`` builds the Collector, Jaeger, Prometheus and Alertmanager from
their Go modules at the versions of the image tags in ``deploy/compose/docker-compose.yaml``;
this module runs each of them as compose would, without a container engine:

- the command line is the service's ``command`` in docker-compose.yaml, with its variables
  (``${JAEGER_CONFIG:-config.yaml}``) taken from the environment as compose takes them, and the
  paths its ``volumes`` mount inside the container replaced by the files in the repository
  (named volumes and the image's own data folders by temporary folders): the configuration
  files run unmodified;
- each service has a loopback address of its own (``127.0.10.x``, or ``$LLM_LATENCY_E2E_NET.x``), and runs in a private mount
  namespace whose ``/etc/hosts`` maps the compose service names (and the Helm tiers' cluster
  names) to those addresses, and ``localhost`` to its own: what compose's network gives each
  container;
- the compose files listen on ``0.0.0.0``: the collector's and Jaeger's configurations read
  their listening address from ``OTELCOL_LISTEN_HOST`` / ``JAEGER_LISTEN_HOST`` (default
  ``0.0.0.0``), Prometheus and Alertmanager get ``--web.listen-address``;
- Jaeger's Badger storage reads its folder from ``JAEGER_BADGER_DIR``, whose default (a path in
  the jaeger-data volume) is mapped to the volume's temporary folder like a command-line path.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.chart import rendered_config
from tests.processes import die_with_parent

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose"
COMPOSE_FILE = COMPOSE / "docker-compose.yaml"
HELM = ROOT / "deploy" / "helm"
BUILDS = Path(os.environ.get("LLM_LATENCY_BUNDLE_BUILDS", ROOT / ".tools" / "bundle")) / "bin"

#: The loopback /24 the services listen in: another one (``LLM_LATENCY_E2E_NET=127.0.11``) lets
#: two runs of the bundle share a machine, since the services' ports are fixed.
NET = os.environ.get("LLM_LATENCY_E2E_NET", "127.0.10")
#: The gateway tier's headless Service, which the agents' load_balancing exporter resolves.
GATEWAY_SERVICE = "llm-latency-gateway.observability.svc.cluster.local"

#: Each service's own loopback address, and the host names that reach it.
ADDRESSES = {
    "otel-collector": f"{NET}.1",
    "jaeger": f"{NET}.2",
    "prometheus": f"{NET}.3",
    "alertmanager": f"{NET}.4",
    "agent": f"{NET}.5",
    "gateway": f"{NET}.6",
    "jaeger-ttl": f"{NET}.7",  # a second Jaeger, with a short retention (tests/e2e/test_storage.py)
    "advise": f"{NET}.8",  # llm-latency advise, the findings service
    # the second gateway pod, and the Jaeger it exports to (tests/e2e/test_tail_sampling.py)
    "gateway-2": f"{NET}.14",
    "jaeger-2": f"{NET}.9",
    # the control plane the probe chart is installed into (tests/e2e/kube.py)
    "etcd": f"{NET}.20",
    "kube-apiserver": f"{NET}.21",
    # Jaeger on OpenSearch, two replicas, and the index cleaner (tests/e2e/test_opensearch.py)
    "opensearch": f"{NET}.10",
    "jaeger-os-1": f"{NET}.11",
    "jaeger-os-2": f"{NET}.12",
    "es-index-cleaner": f"{NET}.13",
}
HOST_NAMES = {
    "otel-collector": ["otel-collector"],
    "jaeger": ["jaeger", "jaeger.observability.svc.cluster.local"],
    "prometheus": ["prometheus"],
    "alertmanager": ["alertmanager"],
    # deploy/helm/otel-collector-agent.values.yaml: the load_balancing exporter's resolver, the
    # gateway's headless Service: one address per gateway pod
    "gateway": [GATEWAY_SERVICE],
    "gateway-2": [GATEWAY_SERVICE],
    "agent": [],
    "jaeger-ttl": [],
    "advise": ["advise", "llm-latency-advise.observability.svc.cluster.local"],
    "jaeger-2": [],
    "etcd": [],
    "kube-apiserver": [],
    # deploy/helm/jaeger.values.yaml: userconfig's server_urls, storage.elasticsearch.url
    "opensearch": ["opensearch-cluster-master.observability.svc.cluster.local"],
    "jaeger-os-1": [],
    "jaeger-os-2": [],
    "es-index-cleaner": [],
}

#: The binary that runs each compose image.
BINARIES = {
    "otel/opentelemetry-collector-contrib": "otelcol-llm-latency",
    "jaegertracing/jaeger": "jaeger",
    "prom/prometheus": "prometheus",
    "prom/alertmanager": "alertmanager",
}

#: Folders of an image that its service writes to without a volume: a temporary folder each.
IMAGE_DATA = {"prom/alertmanager": ["/alertmanager"]}


def compose_services() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    return services


def image_tag(service: str) -> tuple[str, str]:
    """The image repository and tag of a compose service (the bundle's pinned version)."""
    repository, _, tag = compose_services()[service]["image"].rpartition(":")
    return repository, tag


def binary(name: str) -> Path:
    path = BUILDS / name
    if not path.exists():
        pytest.fail(f"{path} is not built: `make e2e` builds it (deploy/build/build-bundle)")
    return path


def hosts_file(
    directory: Path, service: str, names: Mapping[str, Sequence[str]] | None = None
) -> Path:
    """An /etc/hosts for ``service``: every service's names, and localhost as itself; ``names``
    gives some host names other addresses (a name with none is left out).

    Written in place: a service started with it (a bind mount of the file) reads the new
    contents at its next lookup, as a pod's resolver sees a Service's endpoints change."""
    table: dict[str, list[str]] = {}
    for name, address in ADDRESSES.items():
        for host in HOST_NAMES[name]:
            table.setdefault(host, []).append(address)
    table.update({host: list(addresses) for host, addresses in (names or {}).items()})
    lines = [f"{ADDRESSES[service]} localhost"]
    lines += [f"{address} {host}" for host, addresses in table.items() for address in addresses]
    path = directory / f"hosts.{service}"
    with path.open("r+" if path.exists() else "w") as file:  # the same inode: see above
        file.write("\n".join(lines) + "\n")
        file.truncate()
    return path


def _namespace_prefix(binds: Sequence[tuple[Path, Path]]) -> list[str]:
    """A command prefix that bind-mounts each (source, target) in a mount namespace of its own,
    then runs the rest of the command there."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    script = 'while [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 97; shift 2; done; shift; exec "$@"'
    pairs = [str(part) for source, target in binds for part in (source, target)]
    return [
        "unshare",
        *user,
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "sh",
        *pairs,
        "--",
    ]


#: A compose variable in a command: ``${NAME}`` or ``${NAME:-default}``.
COMPOSE_VARIABLE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")

#: The default of the folder Jaeger's Badger storage reads from ``JAEGER_BADGER_DIR``.
BADGER_DIR = re.compile(r"\$\{env:JAEGER_BADGER_DIR:-([^}]+)\}")


def interpolate(argument: str) -> str:
    """A compose command's argument with its variables replaced, as ``docker compose`` does from
    the environment it runs in."""
    return COMPOSE_VARIABLE.sub(
        lambda match: os.environ.get(match.group(1)) or match.group(2) or "", argument
    )


def _config_file(arguments: Sequence[str]) -> Path:
    (path,) = [a.removeprefix("--config=") for a in arguments if a.startswith("--config=")]
    return Path(path)


def get_json(url: str, params: Mapping[str, Any] | None = None, timeout: float = 10) -> Any:
    if params:
        url += "?" + urllib.parse.urlencode(params, doseq=True)
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


@dataclass
class Service:
    """One running service: its process, its address and its log."""

    name: str
    command: list[str]
    env: dict[str, str]
    log: Path
    ready_url: str
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    #: For a ``ready_url`` served over HTTPS with a certificate of the service's own making.
    ready_context: ssl.SSLContext | None = None

    def start(self, timeout: float = 60) -> None:
        # A second process on the same data would fail on it (Badger: "Cannot acquire directory
        # lock"): the previous one must be gone, as stop() waits for.
        if self.process is not None and self.process.poll() is None:
            pytest.fail(f"{self.name} started again while its process {self.process.pid} runs")
        with contextlib.suppress(OSError, urllib.error.URLError):
            urllib.request.urlopen(self.ready_url, timeout=2, context=self.ready_context).close()
            pytest.fail(
                f"{self.ready_url} answers before {self.name} starts: a bundle left running?"
            )
        self.starts += 1
        with self.log.open("ab") as log:
            log.write(f"--- start {self.starts}: {' '.join(self.command)}\n".encode())
            self.process = subprocess.Popen(
                self.command,
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"{self.name} exited with {self.process.returncode}:\n{self.tail()}")
            with contextlib.suppress(OSError, urllib.error.URLError):
                with urllib.request.urlopen(
                    self.ready_url, timeout=2, context=self.ready_context
                ) as response:
                    if response.status == 200:
                        return
            time.sleep(0.2)
        pytest.fail(f"{self.name} not ready at {self.ready_url} in {timeout} s:\n{self.tail()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
        """Stops the service and waits for its process to exit (killed after ``timeout``)."""
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Bundle:
    """The compose services (and the Helm collector tiers, on demand) on loopback."""

    directory: Path
    services: dict[str, Service] = field(default_factory=dict)

    def url(self, service: str, port: int, path: str = "") -> str:
        return f"http://{ADDRESSES[service]}:{port}{path}"

    # -- the compose services ------------------------------------------------------------------

    def compose_service(
        self,
        name: str,
        extra_binds: Sequence[tuple[Path, Path]] = (),
        *,
        like: str | None = None,
        overrides: Sequence[str] = (),
    ) -> Service:
        """A compose service as its docker-compose.yaml entry runs it; with ``like``, that
        service's entry run as ``name`` (its own address and folders), with ``overrides`` as
        ``--set`` options (Jaeger and the collector)."""
        spec = compose_services()[like or name]
        repository, _ = image_tag(like or name)
        host_path = self._host_paths(name, spec, repository)
        address = ADDRESSES[name]
        arguments = [host_path(interpolate(argument)) for argument in spec.get("command", [])]
        arguments += [f"--set={override}" for override in overrides]
        env: dict[str, str] = {}
        if repository == "otel/opentelemetry-collector-contrib":
            env["OTELCOL_LISTEN_HOST"] = address
            ready = self.url(name, 13133)
        elif repository == "jaegertracing/jaeger":
            env["JAEGER_LISTEN_HOST"] = address
            badger = BADGER_DIR.search(_config_file(arguments).read_text())
            if badger:  # not in config-memory.yaml
                env["JAEGER_BADGER_DIR"] = host_path(badger.group(1))
            ready = self.url(name, 13133, "/status")
        elif repository == "prom/prometheus":
            arguments.append(f"--web.listen-address={address}:9090")
            ready = self.url(name, 9090, "/-/ready")
        else:
            arguments.append(f"--web.listen-address={address}:9093")
            ready = self.url(name, 9093, "/-/ready")
        binds = [(hosts_file(self.directory, name), Path("/etc/hosts")), *extra_binds]
        command = [*_namespace_prefix(binds), str(binary(BINARIES[repository])), *arguments]
        return self._add(Service(name, command, env, self.directory / f"{name}.log", ready))

    def _host_paths(
        self, name: str, spec: Mapping[str, Any], repository: str
    ) -> Callable[[str], str]:
        """A function that replaces, in a path of the container, what ``spec``'s volumes mount
        by the repository's files and the folders of ``name``'s volumes."""
        paths: dict[str, str] = {}
        for volume in spec.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith("."):
                paths[target] = str((COMPOSE / source).resolve())
            else:  # a named volume
                paths[target] = str(self.volume(name, source))
        for folder in IMAGE_DATA.get(repository, []):
            paths[folder] = str(self._folder(f"{name}{folder.replace('/', '-')}"))

        # One pass, longest target first: a replacement is never read again (the repository
        # may itself be under a mounted path, /tmp for one).
        targets = "|".join(re.escape(t) for t in sorted(paths, key=len, reverse=True))
        mounted = re.compile(rf"(?<![\w/])(?:{targets})(?=/|$)")

        def host_path(argument: str) -> str:
            if not paths:
                return argument
            return mounted.sub(lambda match: paths[match.group(0)], argument)

        return host_path

    def volume(self, service: str, volume: str) -> Path:
        """The folder that stands for the named volume ``volume`` of ``service``."""
        return self._folder(f"{service}-{volume}")

    def advise_service(self, overrides: Sequence[str] = ()) -> Service:
        """The compose ``advise`` service: its ``llm-latency advise`` command line, run from the
        repository's source with this interpreter (as the probe's test runs ``watch``), on its
        own address; ``overrides`` are more options (the last of an option wins)."""
        (script,) = [a for a in compose_services()["advise"]["command"] if "llm-latency" in a]
        arguments = shlex.split(script.split("exec llm-latency", 1)[1])
        assert arguments[0] == "advise", arguments
        address = ADDRESSES["advise"]
        arguments[arguments.index("--host") + 1] = address
        command = [
            *_namespace_prefix([(hosts_file(self.directory, "advise"), Path("/etc/hosts"))]),
            sys.executable,
            "-m",
            "llm_latency.cli",
            *arguments,
            *overrides,
        ]
        env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
        ready = self.url("advise", 9466, "/healthz")
        return self._add(Service("advise", command, env, self.directory / "advise.log", ready))

    # -- the Helm collector tiers --------------------------------------------------------------

    def helm_collector(
        self,
        name: str,
        values: Path,
        overrides: Sequence[str] = (),
        *,
        names: Mapping[str, Sequence[str]] | None = None,
        binds: Sequence[tuple[Path, Path]] = (),
        env: Mapping[str, str] | None = None,
    ) -> Service:
        """A collector tier of deploy/helm/ with the configuration the collector chart renders
        from its values (tests/e2e/chart.py: the chart's default config, the values' ``config``
        merged in, the presets they turn on), on its own address as its pod IP. ``overrides``
        are the collector's own ``--set`` options, ``names`` host names that resolve elsewhere
        for it (``hosts_file``), ``binds`` and ``env`` what its pod would have beside (a service
        account's token, the API server's address)."""
        config = rendered_config(yaml.safe_load(values.read_text()))
        path = self.directory / f"{name}.config.yaml"
        path.write_text(yaml.safe_dump(config))
        address = ADDRESSES[name]
        hosts = hosts_file(self.directory, name, names)
        command = [
            *_namespace_prefix([(hosts, Path("/etc/hosts")), *binds]),
            str(binary("otelcol-llm-latency")),
            f"--config={path}",
            *(f"--set={override}" for override in overrides),
        ]
        return self._add(
            Service(
                name,
                command,
                {"MY_POD_IP": address, **(env or {})},
                self.directory / f"{name}.log",
                self.url(name, 13133),
            )
        )

    def resolve(self, service: str, names: Mapping[str, Sequence[str]]) -> None:
        """Changes what host names resolve to for a running ``service`` (its /etc/hosts)."""
        hosts_file(self.directory, service, names)

    def _add(self, service: Service) -> Service:
        self.services[service.name] = service
        return service

    def _folder(self, name: str) -> Path:
        folder = self.directory / name
        folder.mkdir(exist_ok=True)
        return folder

    def stop(self) -> None:
        for service in reversed(list(self.services.values())):
            service.stop()


def wait_for(check: Any, timeout: float, interval: float = 1.0, what: str = "") -> Any:
    """Calls ``check()`` until it returns something true, and returns that; fails after
    ``timeout`` seconds with the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        with contextlib.suppress(OSError, urllib.error.URLError, KeyError, IndexError):
            last = check()
            if last:
                return last
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what or check}: last {last!r}")
        time.sleep(interval)


def otlp_trace_body(
    trace_id: str,
    resource: Mapping[str, str],
    *,
    name: str,
    kind: int,
    duration_ns: int,
    error: bool = False,
) -> dict[str, Any]:
    """An OTLP/HTTP JSON request body: one span of trace ``trace_id`` that ends now, from a
    program whose resource has the string attributes ``resource``; ``error``: its status is
    ERROR (code 2)."""
    now = time.time_ns()
    span: dict[str, Any] = {
        "traceId": trace_id,
        "spanId": secrets.token_hex(8),
        "name": name,
        "kind": kind,
        "startTimeUnixNano": str(now - duration_ns),
        "endTimeUnixNano": str(now),
    }
    if error:
        span["status"] = {"code": 2}
    attributes = [{"key": k, "value": {"stringValue": v}} for k, v in resource.items()]
    return {
        "resourceSpans": [
            {"resource": {"attributes": attributes}, "scopeSpans": [{"spans": [span]}]}
        ]
    }
