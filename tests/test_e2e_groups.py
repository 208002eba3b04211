"""make e2e runs every end-to-end module, each once, in groups that share nothing: each group's
bundle on a loopback /24 of its own (the services' ports are fixed)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ("e2e-compose", "e2e-scale-out", "e2e-genai-names")


def _dry_run(target: str) -> str:
    """What ``make target`` would run (``make -n``), continued lines joined."""
    return subprocess.run(
        ["make", "--no-print-directory", "-n", target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.replace("\\\n", " ")


def _commands() -> dict[str, list[str]]:
    """Each group's pytest command line, as make would run it."""
    commands = {}
    for group in GROUPS:
        (line,) = [line for line in _dry_run(group).splitlines() if "pytest" in line]
        commands[group] = shlex.split(line)
    return commands


def _net(command: list[str]) -> str:
    (net,) = [w.split("=", 1)[1] for w in command if w.startswith("LLM_LATENCY_E2E_NET=")]
    return net


def _modules(command: list[str]) -> list[str]:
    return [w for w in command if re.fullmatch(r"tests/e2e/test_\w+\.py", w)]


def test_every_e2e_module_runs_once_in_the_bundle_groups() -> None:
    commands = _commands()
    grouped = _modules(commands["e2e-compose"]) + _modules(commands["e2e-scale-out"])
    present = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "e2e").glob("test_*.py"))
    assert sorted(grouped) == present
    assert _modules(commands["e2e-genai-names"]) == ["tests/e2e/test_metrics.py"]
    assert "OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental" in commands["e2e-genai-names"]


def test_each_group_has_a_loopback_net_of_its_own() -> None:
    nets = [_net(command) for command in _commands().values()]
    assert len(set(nets)) == len(GROUPS)
    assert all(re.fullmatch(r"127\.\d+\.\d+", net) for net in nets)


def test_make_e2e_runs_the_groups_side_by_side() -> None:
    assert re.search(r"-j3 --output-sync=target " + " ".join(GROUPS), _dry_run("e2e"))
