"""The last diagnosis as Prometheus metrics, in the text exposition format (version 0.0.4).

Per (service, host, rule): the saving's share of the calls' time
(``llm_latency_advice_saving_ratio``, what the alert reads), the seconds it saves per minute
and the evidence's count; ``llm_latency_advice_finding_info`` carries the fix in words in its
``fix`` label and the address of its page in ``page``, for the alert's notification. The rules
are a fixed set and the keys are bounded (:class:`~llm_latency.advise.advisor.Settings`), so
are the series. Then the service's own
health: spans received, calls let go early, the diagnosis's CPU time.
"""

from __future__ import annotations

from collections.abc import Iterable

from llm_latency.advise.advisor import Snapshot
from llm_latency.advise.page import link

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: The longest ``fix`` label written (a fix is a sentence; a label is no place for a page).
MAX_FIX = 400


def escape(value: str) -> str:
    """A label value as the text format writes it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{name}="{escape(value)}"' for name, value in pairs)
    return "{" + inner + "}" if inner else ""


def _number(value: float) -> str:
    return repr(float(value)) if value == value else "NaN"


class _Family:
    def __init__(self, name: str, kind: str, text: str) -> None:
        self.lines = [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        self.name = name

    def add(self, value: float, *labels: tuple[str, str]) -> None:
        self.lines.append(f"{self.name}{_labels(labels)} {_number(value)}")


def exposition(snapshot: Snapshot, base_url: str = "") -> str:
    """The metrics of ``snapshot`` as the text a Prometheus scrape reads; ``base_url``: where
    the findings page is served to its readers, for the ``page`` label."""
    ratio = _Family(
        "llm_latency_advice_saving_ratio",
        "gauge",
        "Share of the calls' time in the window that the finding's fix would save (0-1).",
    )
    per_minute = _Family(
        "llm_latency_advice_saving_seconds_per_minute",
        "gauge",
        "Seconds of the calls' time the finding's fix would save per minute of traffic.",
    )
    evidence = _Family(
        "llm_latency_advice_evidence",
        "gauge",
        "How many requests (or calls) of the window show the finding.",
    )
    info = _Family(
        "llm_latency_advice_finding_info",
        "gauge",
        "The current findings, 1 each; the fix in words in fix, the findings page in page.",
    )
    for advice in snapshot.advice:
        key = (("service", advice.service), ("host", advice.host), ("rule", advice.rule))
        ratio.add(advice.share, *key)
        per_minute.add(advice.per_minute, *key)
        evidence.add(advice.finding.evidence.count, *key)
        page = base_url.rstrip("/") + link(advice.service, advice.host)
        info.add(1, *key, ("fix", advice.finding.fix[:MAX_FIX]), ("page", page))
    calls = _Family(
        "llm_latency_advice_window_calls", "gauge", "Calls in each window at the last diagnosis."
    )
    for window in snapshot.windows:
        calls.add(window.calls, ("service", window.service), ("host", window.host))
    health = [
        ("llm_latency_advice_spans_received", "counter", "Spans received.", "_total",
         snapshot.spans_received),
        ("llm_latency_advice_calls_dropped", "counter",
         "Calls let go before their window's time: pushed out by newer ones.", "_total",
         snapshot.calls_dropped),
        ("llm_latency_advice_pending_spans", "gauge",
         "Spans of traces not settled yet.", "", snapshot.pending_spans),
        ("llm_latency_advice_diagnosis_cpu_seconds", "gauge",
         "CPU seconds the last diagnosis of every window took.", "", snapshot.cpu_seconds),
        ("llm_latency_advice_diagnosis_errors", "counter",
         "Windows whose diagnosis failed.", "_total", snapshot.errors),
        ("llm_latency_advice_last_diagnosis_timestamp_seconds", "gauge",
         "When the last diagnosis ran (s since the epoch).", "", snapshot.at),
    ]  # fmt: skip
    lines = [*ratio.lines, *per_minute.lines, *evidence.lines, *info.lines, *calls.lines]
    for name, kind, text, suffix, value in health:
        family = _Family(name + suffix, kind, text)
        family.add(value)
        lines += family.lines
    return "\n".join(lines) + "\n"
