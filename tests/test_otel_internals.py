"""OpenTelemetry's private names are read in ``llm_latency.otel_internals`` only, and its one
version gate decides every fast path: outside the tested SDK releases, phase spans, request
spans and histogram records all take the public API."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.version import __version__ as sdk_version
from opentelemetry.trace import SpanKind

from llm_latency import otel_internals
from llm_latency.histograms import HistogramRecorder
from llm_latency.late_spans import LateSpan
from llm_latency.phase_spans import PhaseSpanWriter

SRC = Path(__file__).parents[1] / "src" / "llm_latency"
HOME = SRC / "otel_internals.py"
#: semconv publishes its incubating conventions under ``_incubating``: their documented place.
PUBLISHED = ("opentelemetry.semconv._incubating",)
#: Private names OpenTelemetry shares with the client libraries, which the adapters read of
#: those (httpcore's ``_lock``): the scan cannot tell whose they are.
SHARED = {"_lock"}
#: What the other modules would read had ``otel_internals`` not taken it over (a check that
#: the scan below sees what it must).
EXPECTED = {
    "_measurement_consumer",
    "_reader_storages",
    "_sdk_config",
    "_meter_config",
    "_instrumentation_scope",
    "_span_limits",
    "_tracer_metrics",
    "_is_enabled",
    "_attributes",
    "_lock",
    "_end_time",
    "_span_processors",
    "_on_ending",
    "_tracer",
    "_ProxyMeterProvider",
    "_MeterConfig",
    "_Span",
    "_import_exporters",
    "_preferred_temporality",
    "_endpoint",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_import(node: ast.AST) -> str | None:
    """The private OpenTelemetry module or name ``node`` imports, if it is such an import."""
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opentelemetry"):
        module = node.module or ""
        names = [alias.name for alias in node.names if _private(alias.name)]
    elif isinstance(node, ast.Import):
        module = next((a.name for a in node.names if a.name.startswith("opentelemetry")), "")
        names = []
    else:
        return None
    if module.startswith(PUBLISHED):
        return None
    if any(_private(part) for part in module.split(".")) or names:
        return f"{module} {' '.join(names)}".strip()
    return None


def _slots(tree: ast.AST) -> set[int]:
    """The ids of the string nodes of ``__slots__`` (a class's own attributes)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
        ):
            found.update(id(n) for n in ast.walk(node.value))
    return found


def private_reads(path: Path) -> list[tuple[int, str]]:
    """Every private name ``path`` reads of something not its own: an attribute of anything but
    ``self`` or ``cls``, a name as a string (``getattr``), a private import of OpenTelemetry."""
    tree = ast.parse(path.read_text(), str(path))
    slots = _slots(tree)
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        imported = _private_import(node)
        if imported is not None:
            found.append((line, imported))
            if isinstance(node, ast.ImportFrom):
                found.extend((line, a.name) for a in node.names if _private(a.name))
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                found.append((line, node.attr))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.isidentifier()
            and _private(node.value)
            and id(node) not in slots
        ):
            found.append((line, node.value))
    return found


def test_no_module_but_otel_internals_reads_a_private_opentelemetry_name() -> None:
    """The names ``otel_internals`` reads of OpenTelemetry's objects are read nowhere else in
    ``src/`` (but on ``self``), and no other module imports a private OpenTelemetry module or
    name."""
    theirs = {name for _, name in private_reads(HOME)}
    assert theirs >= EXPECTED, EXPECTED - theirs
    theirs -= SHARED
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path == HOME:
            continue
        for line, name in private_reads(path):
            if name in theirs or name.startswith("opentelemetry"):
                found.append(f"{path.relative_to(SRC)}:{line}: {name}")
    assert found == [], "read OpenTelemetry's private names through otel_internals:\n" + "\n".join(
        found
    )


def fast_paths() -> dict[str, bool]:
    """Which fast path each writer and recorder made now takes."""
    tracer = TracerProvider().get_tracer("t")
    writer = PhaseSpanWriter(tracer)
    parent = tracer.start_span("parent")
    request = writer.start_request("POST", SpanKind.CLIENT, {}, (), 1)
    histogram = MeterProvider().get_meter("m").create_histogram("h")
    return {
        "phase spans": writer.fast_path(parent) is not None,
        "request span": isinstance(request, LateSpan),
        "histogram records": HistogramRecorder(histogram).direct,
    }


@pytest.mark.parametrize(
    ("version", "taken"),
    [(sdk_version, True), ("2.0.0", False), ("1.42.9", False), ("a.b", False)],
)
def test_one_gate_for_every_fast_path(
    monkeypatch: pytest.MonkeyPatch, version: str, taken: bool
) -> None:
    monkeypatch.setattr(otel_internals, "SDK_VERSION", version)
    assert otel_internals.is_tested_release() is taken
    assert fast_paths() == dict.fromkeys(fast_paths(), taken)


def test_a_tracer_that_is_not_the_sdks_takes_the_public_api() -> None:
    assert otel_internals.is_tested_release(sdk_version)
    assert otel_internals.tracer_parts(trace.NoOpTracer()) is None
    assert otel_internals.tracer_parts(TracerProvider().get_tracer("t")) is not None
