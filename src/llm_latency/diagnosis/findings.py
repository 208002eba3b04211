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
from dataclasses import asdict, dataclass
from typing import Any

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


@dataclass(frozen=True)
class Saving:
    """The expected saving of a fix: per request at p50 and p95 (s), on ``requests`` requests."""

    p50: float
    p95: float
    requests: int

    @property
    def total(self) -> float:
        """Seconds saved over all the requests concerned, at p50."""
        return self.p50 * self.requests

    def text(self) -> str:
        """``saves about 820 ms per request at p50 (1.20 s at p95), on 30 requests``."""
        if self.requests == 1:
            return f"saves about {duration(self.p50)}"
        at_p95 = f" ({duration(self.p95)} at p95)" if self.p95 > self.p50 * 1.05 else ""
        return (
            f"saves about {duration(self.p50)} per request at p50{at_p95}, "
            f"on {self.requests} requests: {duration(self.total)} in all"
        )


@dataclass(frozen=True)
class Finding:
    """One diagnosis: ``rule`` (a stable id), the ``cause`` in a sentence, the ``evidence``,
    the ``fix``, and its ``saving`` (None when no client-side change can shorten the time)."""

    rule: str
    cause: str
    evidence: Evidence
    fix: str
    saving: Saving | None

    def as_json(self) -> dict[str, Any]:
        """The finding as JSON-ready data (seconds as numbers)."""
        data = asdict(self)
        if self.saving is not None:
            data["saving"]["total"] = self.saving.total
        return data

    def lines(self) -> list[str]:
        """The finding as three short lines of text: cause and evidence, fix, saving."""
        saving = self.saving.text() if self.saving is not None else "no client-side saving"
        return [
            f"{self.cause} ({self.evidence.text()})",
            f"fix: {self.fix}",
            saving,
        ]
