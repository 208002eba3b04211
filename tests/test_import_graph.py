"""The import graph of ``src/llm_latency``: no cycle, and every arrow points down the layers.

Every import counts: at module level, under ``TYPE_CHECKING`` and inside functions (a lazy
import that points up is still an arrow up). Run it alone with
``.venv/bin/python -m pytest tests/test_import_graph.py``; a new module goes into
:data:`LAYERS` before the test passes.
"""

from __future__ import annotations

import ast
import graphlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).parents[1] / "src"

#: Top first. A module may import modules of its own layer (the cycle check keeps those
#: apart) and of the layers below it; a name covers its package's modules.
LAYERS: tuple[tuple[str, ...], ...] = (
    # the command line, on the public API
    ("llm_latency.cli", "llm_latency.advise"),
    # the public API: the package itself
    ("llm_latency",),
    # what OpenTelemetry loads by entry point
    ("llm_latency.instrumentor", "llm_latency.console_exporter"),
    # the hooks on client libraries and SDKs, and the retry helper: they drive the emitter;
    # the ends of a process llm-latency flushes at (it hooks uvicorn through the adapters' layer)
    ("llm_latency.adapters", "llm_latency.retry", "llm_latency.lifecycle"),
    # attempts into spans and metrics
    ("llm_latency.emitter",),
    # the emitter's parts
    (
        "llm_latency.request_start",
        "llm_latency.span_writer",
        "llm_latency.in_flight",
        "llm_latency.call_spans",
        "llm_latency.tracer_handle",
        "llm_latency.metrics",
        "llm_latency.genai_metrics",
        "llm_latency.settings",
        "llm_latency.histograms",
        "llm_latency.pools",
        "llm_latency.observables",
        "llm_latency.phase_spans",
        "llm_latency.late_spans",
    ),
    # what the emitter keeps and reads; the SDK set-up; reading finished traces
    (
        "llm_latency.attempt_record",
        "llm_latency.attribute_table",
        "llm_latency.facts",
        "llm_latency.setup",
        "llm_latency.early_spans",
        "llm_latency.zero_code",
        "llm_latency.export_health",
        "llm_latency.call_tree",
        "llm_latency.console_findings",
        "llm_latency.trace_files",
        "llm_latency.trace_json",
        "llm_latency.jaeger_query",
        "llm_latency.diagnosis",
    ),
    # OpenTelemetry's private internals, read in this one module (tests/test_otel_internals.py)
    ("llm_latency.otel_internals",),
    # plain records and names, no OpenTelemetry SDK in them
    (
        "llm_latency.calls",
        "llm_latency.event_loop",
        "llm_latency.lag_monitor",
        "llm_latency.timeline",
        "llm_latency.streams",
        "llm_latency.tokens",
        "llm_latency.usage",
        "llm_latency.sse",
        "llm_latency.semconv",
        "llm_latency.headers",
        "llm_latency.urls",
        "llm_latency.suppression",
        "llm_latency.import_hooks",
    ),
    # leaves
    (
        "llm_latency.clock",
        "llm_latency.cpu_wait",
        "llm_latency.providers",
        "llm_latency.provider_profiles",
        "llm_latency.openai_compatible_profiles",
        "llm_latency.native_api_profiles",
        "llm_latency.provider_schema",
        "llm_latency.version",
        "llm_latency.testing",
        "llm_latency.live_state",
        "llm_latency.forks",
        "llm_latency.fault_log",
    ),
)


def modules(src: Path) -> dict[str, Path]:
    """Every module under ``src``, by dotted name (a package by its own name)."""
    found = {}
    for path in src.rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the modules of ``src`` it imports."""
    known = modules(src)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parents = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parents, *filter(None, [node.module])])
                for alias in node.names:  # ``from package import module`` imports the module
                    child = f"{base}.{alias.name}"
                    imported.add(child if child in known else base)
        graph[name] = {module for module in imported if module in known and module != name}
    return graph


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of the longest name that covers ``module``."""
    best, depth = -1, -1
    for index, names in enumerate(LAYERS):
        for name in names:
            covers = module == name or (name != "llm_latency" and module.startswith(name + "."))
            if covers and len(name) > depth:
                best, depth = index, len(name)
    assert best >= 0, f"{module} is in no layer: add it to LAYERS"
    return best


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """An import cycle of ``graph``, or nothing."""
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as found:
        return list(found.args[1])
    return []


def upward(graph: dict[str, set[str]]) -> list[str]:
    """The imports of ``graph`` that point up the layers."""
    return [
        f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if layer_of(target) < layer_of(module)
    ]


def test_no_cycle() -> None:
    graph = import_graph()
    assert graph["llm_latency.emitter"] >= {"llm_latency.call_spans", "llm_latency.timeline"}
    assert cycle(graph) == []


def test_every_import_points_down_the_layers() -> None:
    assert upward(import_graph()) == []


def test_the_checks_see_a_cycle_and_an_arrow_up(tmp_path: Path) -> None:
    # The retry helper's old lazy import of the instrumentor, which imports the retry helper.
    package = tmp_path / "llm_latency"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "instrumentor.py").write_text("from llm_latency import retry\n")
    (package / "retry.py").write_text(
        "def _emitter():\n    from llm_latency.instrumentor import LLMLatencyInstrumentor\n"
    )
    graph = import_graph(tmp_path)
    assert sorted(cycle(graph)[:2]) == ["llm_latency.instrumentor", "llm_latency.retry"]
    assert upward(graph) == [
        "llm_latency.retry (layer 3) imports llm_latency.instrumentor (layer 2)"
    ]


@pytest.mark.parametrize("mode", ["default", "providers"])
def test_the_instrumented_path_imports_no_diagnosis(mode: str) -> None:
    """``import llm_latency``, ``instrument()`` and a request through each client import nothing
    of ``llm_latency.diagnosis`` (57 ms and 7,400 objects that every full collection walks),
    with the SDK set up at the first request or with the program's providers; ``diagnose`` and
    ``Finding`` are still there when asked for."""
    program = Path(__file__).parent / "programs" / "no_diagnosis.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    result = subprocess.run(
        [sys.executable, str(program), mode],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["diagnosis"] == []
    if mode == "default":  # set up at the first instrumented request
        assert report["provider"] == "opentelemetry.sdk.trace"
    else:
        assert report["spans"] == 4  # a request span per client
    assert report["findings"] == [] and report["finding"] == "llm_latency.diagnosis.findings"
