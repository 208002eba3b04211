"""A service's traces for a time range, read from Jaeger's query API: what ``llm-latency
explain --jaeger URL --service NAME --since 1h`` diagnoses.

Jaeger 2.x serves its API v3 over HTTP (``/api/v3/traces``, the answer OTLP JSON under
``result``); Jaeger 1.x, and 2.x too, the UI's API (``/api/traces``, Jaeger's JSON). The v3 is
asked first; where it is not served (404 on the path), the UI's. Either way the spans are read
as :mod:`llm_latency.trace_json` reads a saved file.

Traces a tail sampler kept are not the service's calls: kept for being slow or failed, most of
the healthy ones dropped. The traces say so in either of two ways, and :func:`fetch` reads both
(:class:`Fetched`): the bundle's Helm gateway marks every span it passes on with the resource
attribute ``llm_latency.tail_sampled`` (its ``resource/tail-sampled`` processor, after the tail
sampling); and the Collector's tail sampling itself names the policy that kept a trace
(``tailsampling.policy``) under the feature gate ``processor.tailsamplingprocessor.recordpolicy``,
but on the spans' scope, which Jaeger keeps only on some storage backends (not Badger, whose
span model has no scope attributes).
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple

from llm_latency.diagnosis.records import SpanRecord
from llm_latency.trace_json import (
    TraceFileError,
    jaeger_error,
    jaeger_spans,
    jaeger_traces,
    otlp_spans,
)

#: The attribute the Collector's tail sampling puts on the scope of the spans of a trace it
#: kept (under its feature gate): the name of the policy that kept it.
TAIL_SAMPLING_POLICY: Final = "tailsampling.policy"
#: The resource attribute the bundle's tail-sampling gateway puts on every span it passes on.
TAIL_SAMPLED: Final = "llm_latency.tail_sampled"
#: The most traces asked for by default.
LIMIT: Final = 1000
_SINCE: Final = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class Fetched(NamedTuple):
    """A service's spans read from Jaeger, and what they say of tail sampling: whether a tail
    sampler kept them (``tail_sampled``: either mark seen) and the policies named."""

    spans: list[SpanRecord]
    tail_sampled: bool
    policies: list[str]


class JaegerError(Exception):
    """Jaeger could not be read: the message is one line."""


def since_seconds(text: str) -> float:
    """``90s``, ``15m``, ``1h``, ``2d`` (or a sum: ``1h30m``) in seconds."""
    parts = _SINCE.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"{text!r} is not a duration such as 90s, 15m, 1h or 2d")
    return sum(float(number) * _UNITS[unit] for number, unit in parts)


def _get(url: str, timeout: float) -> Any:
    """The JSON of ``url``; a 404 as ``None`` when its body is not Jaeger's "no traces"."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as error:
        body = error.read().decode("utf-8", "replace")
        if error.code == 404:
            return {"notFound": body}
        raise JaegerError(f"{url} answered {error.code}: {body.strip()[:200]}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise JaegerError(f"cannot reach Jaeger at {url}: {reason}") from None
    except json.JSONDecodeError:
        raise JaegerError(f"{url} did not answer JSON: is it Jaeger's query service?") from None


def _is_no_traces(answer: Any) -> bool:
    """Jaeger's API v3 answers a query that found nothing with a 404 that says so."""
    text = str(answer.get("notFound", "")) if isinstance(answer, dict) else ""
    return "no traces found" in text.lower()


def fetch(
    base: str,
    service: str,
    since: float,
    limit: int = LIMIT,
    now: float | None = None,
    timeout: float = 30.0,
) -> Fetched:
    """The spans of ``service``'s traces that started in the last ``since`` seconds (at most
    ``limit`` traces) from the Jaeger query service at ``base`` (``http://jaeger:16686``), and
    whether they say a tail sampler kept them."""
    end = time.time() if now is None else now
    start = end - since
    base = base.rstrip("/")
    name = f"Jaeger at {base}"
    v3 = f"{base}/api/v3/traces?" + urllib.parse.urlencode(
        {
            "query.service_name": service,
            "query.start_time_min": _rfc3339(start),
            "query.start_time_max": _rfc3339(end),
            "query.num_traces": limit,
        }
    )
    answer = _get(v3, timeout)
    if isinstance(answer, dict) and "result" in answer:
        return Fetched(list(otlp_spans(answer["result"], name)), *tail_sampling(answer["result"]))
    if _is_no_traces(answer):
        return Fetched([], False, [])
    v2 = f"{base}/api/traces?" + urllib.parse.urlencode(
        {"service": service, "start": int(start * 1e6), "end": int(end * 1e6), "limit": limit}
    )
    answer = _get(v2, timeout)
    if isinstance(answer, dict) and "notFound" in answer:
        raise JaegerError(f"{base} serves neither Jaeger's API v3 nor /api/traces")
    if (error := jaeger_error(answer)) is not None:
        raise JaegerError(f"{name} answered with an error: {error}")
    traces = jaeger_traces(answer)
    if traces is None:
        raise JaegerError(f"{v2} is not Jaeger's answer")
    try:
        spans = [span for trace in traces for span in jaeger_spans(trace, name)]
    except TraceFileError as exc:
        raise JaegerError(str(exc)) from None
    return Fetched(spans, *tail_sampling(traces))


def tail_sampling(document: Any) -> tuple[bool, list[str]]:
    """Whether ``document`` (Jaeger's answer: OTLP JSON, or Jaeger's JSON) says a tail sampler
    kept its traces, and the policies named: every ``llm_latency.tail_sampled`` that is true and
    every ``tailsampling.policy``, wherever they are (OTLP JSON's resource and scope attributes;
    in Jaeger's JSON, a process's or a span's tags)."""
    policies: set[str] = set()
    marked = False
    stack = [document]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            key = node.get("key")
            if key == TAIL_SAMPLING_POLICY:
                policies.add(str(_value(node.get("value"))))
            elif key == TAIL_SAMPLED:
                marked = marked or _value(node.get("value")) in (True, "true")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return marked or bool(policies), sorted(policies)


def _value(value: Any) -> Any:
    """An attribute's value: OTLP JSON's ``{"stringValue": ...}`` or ``{"boolValue": ...}``,
    or Jaeger's plain value."""
    if isinstance(value, dict):
        for kind in ("stringValue", "boolValue"):
            if kind in value:
                return value[kind]
    return value


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
