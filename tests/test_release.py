"""The wheel, installed in a fresh virtual environment, runs README's quick start program.

The fresh environment gets the wheel and nothing of the checkout: the editable install of the
test environment is not on its path. Its dependencies come from the test environment's
site-packages, added after its own by a ``.pth`` line (the suite sends nothing off the machine,
so it cannot download them), and ``pip check`` there confirms the wheel's requirements are met.
The fresh environment has no pip or setuptools of its own (the test environment's pip works on
it with ``--python``): a bundled setuptools older than the test environment's would shadow it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from tests.command_line import mock_server
from tests.wheel_build import build_wheel

# One worker builds the wheel (two builds at once would share the source tree's build/).
pytestmark = pytest.mark.xdist_group("wheel")

ROOT = Path(__file__).resolve().parent.parent


def quick_start_program() -> str:
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- example: file app.py -->\n```python\n(.*?)^```$", readme, re.S | re.M)
    assert found is not None, "README's quick start has no app.py"
    program = found.group(1)
    assert len(program.splitlines()) <= 20
    return program


def test_the_wheel_in_a_fresh_environment_runs_the_quick_start(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    fresh = tmp_path / "fresh"
    venv.create(fresh, with_pip=False)
    python = fresh / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    subprocess.run(
        [*pip, "install", "-q", "--no-index", "--no-deps", str(wheel)], check=True, timeout=300
    )
    own = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(own) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    check = subprocess.run([*pip, "check"], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout

    (tmp_path / "app.py").write_text(quick_start_program())
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(OTEL_TRACES_EXPORTER="llm_latency_console", OTEL_METRICS_EXPORTER="none")
    env["COLUMNS"] = "100"
    with mock_server("--rate-limit-every", "2", "--ttfb", "0.05") as mock:
        port = mock.url.split(":")[2].split("/")[0]
        program = (tmp_path / "app.py").read_text().replace(":8000/", f":{port}/")
        (tmp_path / "app.py").write_text(program)
        where = subprocess.run(
            [python, "-c", "import llm_latency; print(llm_latency.__file__)"],
            capture_output=True, text=True, check=True, cwd=tmp_path,
        ).stdout  # fmt: skip
        run = subprocess.run(
            [python, "app.py"], capture_output=True, text=True, cwd=tmp_path, env=env,
            timeout=120, check=False,
        )  # fmt: skip
    assert where.startswith(own), where  # the wheel's, not the checkout's
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("openai chat.completions") == 2, run.stderr
    assert "retry.backoff" in run.stderr and "resend_count=1" in run.stderr
    assert all(len(line) <= 100 for line in run.stderr.splitlines()), run.stderr
