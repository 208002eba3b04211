"""The applied scenarios: advice that pays when it is applied.

Each program has a known cause and a configuration (:class:`~tests.scenarios.client_programs.
Config`). It is run once against real peers on loopback, instrumented, and diagnosed; the top
finding's fix is applied by :func:`applied`, which reads only the finding's
:class:`~llm_latency.diagnosis.Fix` (the API, how it is applied, its settings); the program
is run again, and what the user sees (the batch's wall time, or each call's p50, as the
finding's saving says) is compared with what the finding predicted. ``tests/test_advice_
applied.py`` runs them; ``bench/advice_applied.py`` prints the table of docs/diagnosis.md.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from llm_latency.diagnosis import Call, Finding, Fix, diagnose
from llm_latency.diagnosis.findings import DECORATE, P50, REUSE, WALL, percentile
from llm_latency.diagnosis.seen import wall_time
from tests.scenarios.applied_programs import (
    Program,
    distant,
    dns_burst,
    pooled,
    rate_limited,
    run,
)
from tests.scenarios.client_programs import (
    Config,
    aiohttp_burst,
    aiohttp_calls,
    httpx_burst,
    httpx_calls,
    requests_burst,
    requests_calls,
)


def applied(fix: Fix, config: Config) -> Config:
    """``config`` with ``fix`` applied, reading nothing but the fix: one client for the
    program's life (:data:`~llm_latency.diagnosis.findings.REUSE`), the call wrapped in the
    fix's API (:data:`~llm_latency.diagnosis.findings.DECORATE`: the retry policy), and the
    settings, each a field of the configuration named after the API's parameter."""
    names = {field.name for field in fields(Config)}
    unknown = set(fix.parameters) - names
    assert not unknown, f"the fix sets what the program has no setting for: {unknown}"
    settings: dict[str, Any] = fix.parameters
    for name, value in settings.items():
        assert isinstance(value, type(getattr(config, name))), (name, value)
    if fix.how == REUSE:
        settings["reuse"] = True
    elif fix.how == DECORATE:
        settings["retry"] = fix.api
    return replace(config, **settings)


@dataclass(frozen=True)
class Applied:
    """One program with a known cause, in the configuration it starts with; ``first``: the
    finding that must come first; ``api``: the API its fix must name (None: no fix a program
    can apply by rote, and no saving claimed)."""

    name: str
    cause: str
    program: Program
    config: Config
    first: str
    api: str | None


@dataclass(frozen=True)
class Outcome:
    """A scenario's two runs: the calls before and after the fix, the top finding, and the
    predicted and realized savings (s) of what the finding says the user sees."""

    scenario: Applied
    finding: Finding | None
    before: list[Call]
    after: list[Call]

    @property
    def kind(self) -> str | None:
        """What the saving is of: ``wall``, ``p50`` or ``requests``; None without a saving."""
        saving = None if self.finding is None else self.finding.saving
        return None if saving is None else saving.kind

    @property
    def predicted(self) -> float | None:
        """What the top finding says its fix saves, of what it says the user sees."""
        saving = None if self.finding is None else self.finding.saving
        if saving is None:
            return None
        return saving.seen if saving.seen is not None else saving.total

    @property
    def realized(self) -> float | None:
        """What the fix saved, measured the way the finding's saving is stated."""
        if not self.after or self.kind is None:
            return None
        if self.kind == WALL:
            return wall_time(self.before) - wall_time(self.after)
        durations = ([c.duration for c in self.before], [c.duration for c in self.after])
        if self.kind == P50:
            return percentile(durations[0], 50) - percentile(durations[1], 50)
        return sum(durations[0]) - sum(durations[1])

    @property
    def descheduled(self) -> float:
        """The longest time the machine kept an attempt's event loop from a CPU, in either
        run (s; llm_latency.event_loop.descheduled, measured on asyncio clients only)."""
        attempts = [a for call in (*self.before, *self.after) for a in call.attempts]
        return max((a.descheduled or 0.0 for a in attempts), default=0.0)

    @property
    def ratio(self) -> float | None:
        """Realized over predicted."""
        if self.predicted is None or self.realized is None or self.predicted <= 0:
            return None
        return self.realized / self.predicted


def try_advice(scenario: Applied) -> Outcome:
    """Run the scenario, apply its top finding's fix (when it is one) and run it again."""
    before = run(scenario.program, scenario.config)
    findings = diagnose(before)
    top = findings[0] if findings else None
    if top is None or top.change is None or top.saving is None:
        return Outcome(scenario, top, before, [])
    after = run(scenario.program, applied(top.change, scenario.config))
    return Outcome(scenario, top, before, after)


SCENARIOS: tuple[Applied, ...] = (
    Applied("requests-per-call", "requests.post() per call, HTTPS 30 ms away",
            distant(requests_calls, sync=True), Config(reuse=False), "new-connections",
            "requests.Session"),
    Applied("httpx-client-per-call", "an httpx.Client() per call, HTTPS 30 ms away",
            distant(httpx_calls, sync=True), Config(reuse=False), "new-connections",
            "httpx.Client"),
    Applied("aiohttp-session-per-call", "an aiohttp.ClientSession() per call, HTTPS 30 ms away",
            distant(aiohttp_calls, sync=False), Config(reuse=False), "new-connections",
            "aiohttp.ClientSession"),
    Applied("aiohttp-pool", "12 at once, TCPConnector(limit=8, limit_per_host=3)",
            pooled(aiohttp_burst, sync=False), Config(limit=8, limit_per_host=3), "pool-queue",
            "aiohttp.TCPConnector"),
    Applied("httpx-pool", "12 at once, httpx.Limits(max_connections=3)",
            pooled(httpx_burst, sync=False),
            Config(max_connections=3, max_keepalive_connections=3), "pool-queue", "httpx.Limits"),
    Applied("requests-pool", "12 threads, HTTPAdapter(pool_maxsize=3, pool_block=True)",
            pooled(requests_burst, sync=True), Config(pool_maxsize=3), "pool-queue",
            "requests.adapters.HTTPAdapter"),
    Applied("own-retry-loop", "every 2nd request 429 (retry-after 50 ms), the loop sleeps 250 ms",
            rate_limited, Config(retry="own", pause=0.25), "rate-limits", "llm_latency.retry"),
    Applied("dns-burst", "12 at once, DNS 100 ms, aiohttp's DNS cache on", dns_burst,
            Config(), "slow-dns", None),
)  # fmt: skip
