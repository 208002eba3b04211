"""The endpoints ``llm-latency watch`` probes, read from a TOML file and checked before any
request is sent.

A file names each endpoint, its base URL, its provider profile (which fixes the edge and the
inference request), the model, the *name* of the environment variable that holds its API key,
and labels such as the region::

    [monitor]
    every = "30s"          # each endpoint's interval, unless it sets its own
    max_in_flight = 4      # probes in flight at once, over all endpoints
    jitter = 0.1           # each wait is the interval +- this share of it

    [[endpoint]]
    name = "openai"
    url = "https://api.openai.com/v1"
    provider = "openai"
    model = "gpt-4o-mini"
    api_key_env = "OPENAI_API_KEY"
    labels = { region = "eu-west-1" }

A key is never written in the file: a field that would hold one (``api_key``, ``token``...) is
refused, and so is a URL with credentials in it. Each problem is one :class:`CLIError` line.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from llm_latency.cli.errors import CLIError
from llm_latency.cli.monitor_profiles import PROFILES, MonitorProfile

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

EDGE: Final = "edge"
INFERENCE: Final = "inference"
KINDS: Final = (EDGE, INFERENCE)

#: The cost guard: no endpoint is probed more often than this (s), unless the file's
#: ``[monitor] min_interval`` lowers it on purpose.
MIN_INTERVAL: Final = 10.0
DEFAULT_EVERY: Final = 60.0
DEFAULT_MAX_IN_FLIGHT: Final = 4
DEFAULT_JITTER: Final = 0.1
DEFAULT_TIMEOUT: Final = 30.0

#: Field names that would hold a secret: refused anywhere in the file.
_SECRET_FIELDS: Final = frozenset(
    {"api_key", "apikey", "key", "token", "secret", "password", "authorization", "bearer"}
)
_ENV_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Label names become metric attributes beside these: they may not replace them.
_RESERVED_LABELS: Final = frozenset({"name", "kind", "endpoint", "le", "job", "instance"})
_LABEL_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DURATION: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}

_MONITOR_FIELDS: Final = frozenset({"every", "max_in_flight", "jitter", "min_interval", "timeout"})
_ENDPOINT_FIELDS: Final = frozenset(
    {"name", "url", "provider", "model", "api_key_env", "labels", "every", "kinds"}
)


@dataclass(frozen=True)
class Endpoint:
    """One endpoint to probe. ``api_key_env`` names the variable; the key itself is read only
    when a request is built, and never kept in a printed or exported form."""

    name: str
    url: str
    profile: MonitorProfile
    model: str
    api_key_env: str | None
    labels: dict[str, str] = field(default_factory=dict)
    every: float = DEFAULT_EVERY
    kinds: tuple[str, ...] = KINDS

    def api_key(self) -> str | None:
        """The key, from the environment (checked present when the file was read)."""
        return None if self.api_key_env is None else os.environ.get(self.api_key_env)


@dataclass(frozen=True)
class MonitorConfig:
    """The whole file: the endpoints and how the loop runs."""

    endpoints: tuple[Endpoint, ...]
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    jitter: float = DEFAULT_JITTER
    min_interval: float = MIN_INTERVAL
    timeout: float = DEFAULT_TIMEOUT

    def calls_per_day(self) -> dict[str, int]:
        """The estimated requests per day, by probe kind (the cost guard prints it)."""
        calls = dict.fromkeys(KINDS, 0)
        for endpoint in self.endpoints:
            for kind in endpoint.kinds:
                calls[kind] += round(86400 / endpoint.every)
        return calls


def parse_duration(value: Any, what: str) -> float:
    """``30``, ``"30s"``, ``"500ms"``, ``"2m"``, ``"1h"`` as seconds (> 0), else a CLIError."""
    if isinstance(value, bool):
        raise CLIError(f"{what}: {value!r} is not a duration")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if match is None:
            raise CLIError(f"{what}: {value!r} is not a duration such as 30s, 500ms or 2m")
        seconds = float(match[1]) * _UNITS[match[2]]
    if seconds <= 0:
        raise CLIError(f"{what}: the duration must be above 0")
    return seconds


def _refuse_secrets(table: dict[str, Any], where: str) -> None:
    for name, value in table.items():
        if name.lower() in _SECRET_FIELDS:
            raise CLIError(
                f"{where}: a key may not be written in the config file ({name!r}); "
                "put it in an environment variable and give its name as api_key_env"
            )
        if isinstance(value, dict):
            _refuse_secrets(value, f"{where}.{name}")


def _unknown(table: dict[str, Any], known: frozenset[str], where: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise CLIError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(known))})")


def _string(table: dict[str, Any], name: str, where: str, required: bool = True) -> str | None:
    value = table.get(name)
    if value is None:
        if required:
            raise CLIError(f"{where}: {name} is missing")
        return None
    if not isinstance(value, str) or not value.strip():
        raise CLIError(f"{where}: {name} must be a non-empty string")
    return value.strip()


def _url(raw: str, where: str) -> str:
    try:
        parts = urlsplit(raw)
    except ValueError as exc:
        raise CLIError(f"{where}: malformed url: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CLIError(f"{where}: url must be an http:// or https:// URL with a host")
    if parts.username or parts.password or parts.query:
        raise CLIError(
            f"{where}: url may not carry credentials or a query (a key goes in api_key_env)"
        )
    return raw.rstrip("/")


def _api_key_env(table: dict[str, Any], profile: MonitorProfile, where: str) -> str | None:
    name = _string(table, "api_key_env", where, required=profile.needs_key)
    if name is None:
        return None
    if not _ENV_NAME.match(name):
        raise CLIError(
            f"{where}: api_key_env must be the name of an environment variable, not the key itself"
        )
    if not os.environ.get(name):
        raise CLIError(f"{where}: the environment variable {name} (api_key_env) is not set")
    return name


def _labels(raw: Any, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise CLIError(f"{where}: labels must be a table of names and strings")
    labels: dict[str, str] = {}
    for name, value in raw.items():
        if not _LABEL_NAME.match(name) or name in _RESERVED_LABELS:
            raise CLIError(f"{where}: label name {name!r} is not allowed")
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise CLIError(f"{where}: label {name!r} must be a string")
        labels[name] = str(value)
    return labels


def _kinds(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None:
        return KINDS
    if not isinstance(raw, list) or not raw or any(kind not in KINDS for kind in raw):
        raise CLIError(f"{where}: kinds must be a list of {' and '.join(KINDS)}")
    return tuple(kind for kind in KINDS if kind in raw)


def _endpoint(table: Any, number: int, every: float, min_interval: float) -> Endpoint:
    where = f"endpoint {number}"
    if not isinstance(table, dict):
        raise CLIError(f"{where}: must be a table ([[endpoint]])")
    _refuse_secrets(table, where)
    name = _string(table, "name", where)
    assert name is not None
    where = f"endpoint {name!r}"
    _unknown(table, _ENDPOINT_FIELDS, where)
    provider = _string(table, "provider", where)
    profile = PROFILES.get(str(provider).lower())
    if profile is None:
        raise CLIError(
            f"{where}: unknown provider profile {provider!r} (known: {', '.join(sorted(PROFILES))})"
        )
    url = _url(str(_string(table, "url", where)), where)
    own_every = every
    if "every" in table:
        own_every = parse_duration(table["every"], f"{where}: every")
    if own_every < min_interval:
        raise CLIError(
            f"{where}: every {own_every:g}s is below the minimum interval {min_interval:g}s "
            "(the cost guard; [monitor] min_interval lowers it on purpose)"
        )
    return Endpoint(
        name=name,
        url=url,
        profile=profile,
        model=_string(table, "model", where, required=False) or profile.default_model,
        api_key_env=_api_key_env(table, profile, where),
        labels=_labels(table.get("labels"), where),
        every=own_every,
        kinds=_kinds(table.get("kinds"), where),
    )


def parse_config(data: dict[str, Any], every: float | None = None) -> MonitorConfig:
    """The configuration a parsed TOML document describes; ``every`` (``--every``) overrides
    the file's default interval."""
    _refuse_secrets(data, "config")
    _unknown(data, frozenset({"monitor", "endpoint"}), "config")
    monitor = data.get("monitor", {})
    if not isinstance(monitor, dict):
        raise CLIError("[monitor] must be a table")
    _unknown(monitor, _MONITOR_FIELDS, "[monitor]")
    min_interval = MIN_INTERVAL
    if "min_interval" in monitor:
        min_interval = parse_duration(monitor["min_interval"], "[monitor] min_interval")
    default_every = every or parse_duration(monitor.get("every", DEFAULT_EVERY), "[monitor] every")
    max_in_flight = monitor.get("max_in_flight", DEFAULT_MAX_IN_FLIGHT)
    if not isinstance(max_in_flight, int) or isinstance(max_in_flight, bool) or max_in_flight < 1:
        raise CLIError("[monitor] max_in_flight must be a whole number, at least 1")
    jitter = monitor.get("jitter", DEFAULT_JITTER)
    if not isinstance(jitter, (int, float)) or isinstance(jitter, bool) or not 0 <= jitter < 1:
        raise CLIError("[monitor] jitter must be a share of the interval, from 0 to below 1")
    timeout = parse_duration(monitor.get("timeout", DEFAULT_TIMEOUT), "[monitor] timeout")
    raw = data.get("endpoint")
    if not isinstance(raw, list) or not raw:
        raise CLIError("config: no endpoint ([[endpoint]] tables)")
    endpoints = tuple(
        _endpoint(table, number, default_every, min_interval)
        for number, table in enumerate(raw, start=1)
    )
    names = [endpoint.name for endpoint in endpoints]
    duplicate = next((name for name in names if names.count(name) > 1), None)
    if duplicate is not None:
        raise CLIError(f"endpoint {duplicate!r} is named twice")
    return MonitorConfig(endpoints, max_in_flight, float(jitter), min_interval, timeout)


def load_config(path: str, every: float | None = None) -> MonitorConfig:
    """Read and check the TOML file at ``path``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CLIError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CLIError(f"{path} is not valid TOML: {exc}") from None
    return parse_config(data, every)
