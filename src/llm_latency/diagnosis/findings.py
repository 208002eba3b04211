"""A finding: a cause, the measurements that show it, and the fix with its expected saving.

Findings are plain data: the CLI prints them (text, JSON, HTML), ``explain`` and the
development exporter too. Durations are seconds; :func:`duration` writes one for people, the
number and its unit joined by a plain space (``grep "452 ms"`` finds it); the text wrappers
(:func:`keep_units`) never break a line between the two.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final

from llm_latency.diagnosis.model import Attempt, Backoff

NBSP = "\u00a0"

#: A number and the unit after it (``452 ms``, ``1.5 s``, ``38 %``), joined by a plain space.
_NUMBER_UNIT = re.compile(r"(\d) (µs|ms|s|%|MB|kB|B)(?=$|[\s,;:.)\]])")


def keep_units(text: str) -> str:
    """``text`` with a no-break space between each number and its unit, for a line wrapper
    (``textwrap`` breaks at ordinary spaces only); the wrapped lines go back to plain spaces
    with ``.replace(NBSP, " ")``."""
    return _NUMBER_UNIT.sub(lambda m: f"{m[1]}{NBSP}{m[2]}", text)


def duration(seconds: float) -> str:
    """``0.0123`` -> ``12.3 ms``, ``1.234`` -> ``1.23 s``."""
    if seconds != seconds:  # NaN
        return "-"
    magnitude = abs(seconds)
    if magnitude < 0.0009995:
        return f"{seconds * 1e6:.0f} µs"
    if magnitude < 0.09995:  # 0.09996 s is "100 ms", not "100.0 ms"
        return f"{seconds * 1000:.1f} ms"
    if magnitude < 0.9995:  # 0.9996 s is "1.00 s", not "1000 ms"
        return f"{seconds * 1000:.0f} ms"
    if magnitude < 99.995:
        return f"{seconds:.2f} s"
    return f"{seconds:.0f} s"


def percent(share: float) -> str:
    """``0.384`` -> ``38%``."""
    return f"{share * 100:.0f}%"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, by linear interpolation; NaN if empty."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Evidence:
    """What was measured: where (``phase``), what share of the attempts' time it took (or of
    what ``share_of`` names), its p50 and p95 (s) over the ``count`` requests it concerns, out
    of ``requests`` looked at; ``needed``: the fewest requests the rule wants before it speaks,
    and ``min_share`` the smallest share (0: none), stated with the finding."""

    phase: str
    share: float
    p50: float
    p95: float
    count: int
    requests: int
    #: What ``count`` and ``requests`` count: requests (attempts), or whole calls.
    unit: str = "requests"
    share_of: str = "the time"
    needed: int = 1
    min_share: float = 0.0

    @classmethod
    def of(
        cls,
        phase: str,
        values: Sequence[float],
        share: float,
        requests: int,
        unit: str = "requests",
        *,
        share_of: str = "the time",
        needed: int = 1,
        min_share: float = 0.0,
    ) -> Evidence:
        """Evidence from the per-request (or per-call) ``values`` of ``phase``."""
        p50, p95 = percentile(values, 50), percentile(values, 95)
        return cls(phase, share, p50, p95, len(values), requests, unit, share_of, needed, min_share)

    @property
    def enough(self) -> bool:
        """True when the evidence meets its own minimum count and share."""
        return self.count >= self.needed and self.share >= self.min_share

    def text(self) -> str:
        """``http.queue: 38% of the time, p50 820 ms, p95 1.20 s, 30 of 40 requests (a finding
        needs 2 and 5% of the time)``."""
        minimum = ""
        if self.needed > 1 or self.min_share > 0:
            needs = [f"{self.needed}"] + (
                [f"{percent(self.min_share)} of {self.share_of}"] if self.min_share > 0 else []
            )
            minimum = f" (a finding needs {' and '.join(needs)})"
        return (
            f"{self.phase}: {percent(self.share)} of {self.share_of}, p50 {duration(self.p50)}, "
            f"p95 {duration(self.p95)}, {self.count} of {self.requests} {self.unit}{minimum}"
        )


#: What a saving is of (:attr:`Saving.kind`): the wall time of a batch of calls, from its first
#: call's start to its last one's end, ...
WALL: Final = "wall"
#: ... each call's time at p50 (calls spread over time, not a batch) ...
P50: Final = "p50"
#: ... or per request at p50 on ``requests`` requests (a sum: what no single clock shows).
PER_REQUEST: Final = "requests"


@dataclass(frozen=True)
class Saving:
    """The expected saving of a fix: per request at p50 and p95 (s), on ``requests`` requests;
    ``kind`` says what the user will see once the fix is in, and ``seen`` how much (s): the
    batch's wall time shorter by ``seen`` (:data:`WALL`), each call's p50 (:data:`P50`: then
    ``seen`` is ``p50``, over ``requests`` calls), or only the per-request sum
    (:data:`PER_REQUEST`, ``seen`` None)."""

    p50: float
    p95: float
    requests: int
    kind: str = PER_REQUEST
    seen: float | None = None

    @property
    def total(self) -> float:
        """Seconds saved over all the requests concerned, at p50."""
        return self.p50 * self.requests

    def ranked(self, concurrency: float = 1.0) -> float:
        """What findings are ranked by (s): the wall time a batch saves, else the seconds saved
        over the requests, over the ``concurrency`` at which they ran (a batch's requests at
        once save their seconds side by side)."""
        if self.kind == WALL and self.seen is not None:
            return self.seen
        return self.total / max(concurrency, 1.0)

    def text(self) -> str:
        """``saves about 820 ms per request at p50 (1.20 s at p95), on 30 requests``; for a
        batch, ``saves about 480 ms of the batch's wall time (...)``."""
        at_p95 = f" ({duration(self.p95)} at p95)" if self.p95 > self.p50 * 1.05 else ""
        if self.kind == WALL and self.seen is not None:
            calls = "1 call" if self.requests == 1 else f"each of {self.requests} calls"
            return (
                f"saves about {duration(self.seen)} of the batch's wall time (from its first "
                f"call's start to its last one's end; {duration(self.p50)} at p50{at_p95} on "
                f"{calls})"
            )
        if self.kind == P50:
            return (
                f"saves about {duration(self.p50)} per call at p50{at_p95}, on the "
                f"{self.requests} calls"
            )
        if self.requests == 1:
            return f"saves about {duration(self.p50)}"
        return (
            f"saves about {duration(self.p50)} per request at p50{at_p95}, "
            f"on {self.requests} requests: {duration(self.total)} in all"
        )


#: How a :class:`Fix` is applied: one object of its ``api`` for the program's life, every
#: request through it ...
REUSE: Final = "reuse"
#: ... its ``api`` built with its ``settings`` (a client's, a pool's options) ...
CONFIGURE: Final = "configure"
#: ... or the call that makes the request wrapped in its ``api`` called with its ``settings``.
DECORATE: Final = "decorate"

#: A setting's value.
Value = int | float | bool | str


@dataclass(frozen=True)
class Fix:
    """A fix a program can apply by rote: the ``client`` library (or SDK) whose API it names,
    the ``api`` (``requests.Session``, ``aiohttp.TCPConnector``, ``llm_latency.retry``), ``how``
    it is applied (:data:`REUSE`, :data:`CONFIGURE`, :data:`DECORATE`) and the ``settings``
    (parameter, value) to pass. A finding's text names it (:meth:`text`)."""

    client: str
    api: str
    how: str
    settings: tuple[tuple[str, Value], ...] = ()

    @property
    def parameters(self) -> dict[str, Value]:
        """The settings as keyword arguments."""
        return dict(self.settings)

    def call(self) -> str:
        """``aiohttp.TCPConnector(limit=30, limit_per_host=30)``, ``requests.Session()``."""
        arguments = ", ".join(f"{name}={value!r}" for name, value in self.settings)
        return f"{self.api}({arguments})"

    def text(self) -> str:
        """The fix in words: ``one requests.Session() for the program's life, every request
        through it``, ``aiohttp.TCPConnector(limit=30, limit_per_host=30)``,
        ``@llm_latency.retry(attempts=3) on the function that sends the request``."""
        if self.how == REUSE:
            return f"one {self.call()} for the program's life, every request through it"
        if self.how == DECORATE:
            return f"@{self.call()} on the function that sends the request"
        return self.call()

    def as_json(self) -> dict[str, Any]:
        """The fix as JSON-ready data (the settings as an object)."""
        return {"client": self.client, "api": self.api, "how": self.how,
                "settings": self.parameters, "call": self.call()}  # fmt: skip


@dataclass(frozen=True)
class Claim:
    """``seconds`` of part ``part`` of ``of`` (an attempt or a backoff) that a finding's saving
    counts (the parts: :mod:`~llm_latency.diagnosis.claims`)."""

    of: Attempt | Backoff = field(compare=False)
    part: str
    seconds: float


@dataclass(frozen=True)
class Finding:
    """One diagnosis: ``rule`` (a stable id), the ``cause`` in a sentence, the ``evidence``,
    the ``fix`` in words, its ``saving`` (None when no client-side change can shorten the time)
    and ``change``: the fix as a :class:`Fix` a program can apply by rote, when it is one (None:
    the fix is the provider's, the network's, or a choice of the program's); ``claims``: which
    seconds of which attempts the saving counts (:mod:`~llm_latency.diagnosis.claims`; not
    part of the finding's value or of its JSON)."""

    rule: str
    cause: str
    evidence: Evidence
    fix: str
    saving: Saving | None
    change: Fix | None = None
    claims: tuple[Claim, ...] = field(default=(), compare=False, repr=False)

    def as_json(self) -> dict[str, Any]:
        """The finding as JSON-ready data (seconds as numbers)."""
        data = asdict(replace(self, claims=()))
        del data["claims"]
        if self.saving is not None:
            data["saving"]["total"] = self.saving.total
        data["change"] = None if self.change is None else self.change.as_json()
        return data

    def lines(self) -> list[str]:
        """The finding as three short lines of text: cause and evidence, fix, saving."""
        saving = self.saving.text() if self.saving is not None else "no client-side saving"
        return [
            f"{self.cause} ({self.evidence.text()})",
            f"fix: {self.fix}",
            saving,
        ]
