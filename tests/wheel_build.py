"""The project's wheel, built from the checkout as a user's ``pip wheel .`` builds it.

setuptools stages a wheel's files in the checkout's ``build/bdist.<platform>/wheel`` unless told
otherwise, and a staging directory left there (by a build stopped half-way, or by another build
of the same checkout at the same time) fails the next build with "File exists". Each build here
stages in a directory of its own.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_wheel(directory: Path) -> Path:
    """Build the wheel into ``directory`` (staged in a directory of its own under it)."""
    subprocess.run(
        [
            sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(directory),
            f"--config-settings=--build-option=--bdist-dir={directory / 'staging'}", str(ROOT),
        ],
        check=True, timeout=300,
    )  # fmt: skip
    (wheel,) = directory.glob("llm_latency-*.whl")
    return wheel
