"""Every code block of README.md and docs/ is run, or checked against what it claims.

Each fenced block is preceded by a directive, an HTML comment that neither GitHub nor MkDocs
shows (``<!-- example: KIND [ARGUMENT] -->``); a block without one fails the test:

- ``file NAME``: the block is written to ``NAME`` in the page's working directory;
- ``background``: a shell command started and left running for the page's later blocks (the
  mock server): the test waits until its port accepts connections and stops it at the end;
- ``run [ID]``: a shell block run with bash (``pip install`` lines with ``--no-index``: the
  package must already be there, nothing is downloaded), which must exit 0; its output
  (stdout and stderr) is kept under ``ID``;
- ``output ID``: what the page shows of run ``ID``'s output, compared after normalising
  durations, ids and line breaks; a ``...`` line stands for any lines;
- ``install``: ``pip install`` lines, each naming extras that pyproject.toml defines
  (tests/test_release.py installs the wheel so, for real, in a fresh environment);
- ``make``: ``make`` lines, each naming a target of the Makefile;
- ``signature NAME``: the signature of the public function ``NAME``, as ``inspect`` gives it;
- ``sketch``: a drawing whose span names must be the names in ``llm_latency.semconv``;
- ``not-run docker``: ``docker`` commands only (no Docker engine runs the suite; ``make e2e``
  runs the bundle's services for real, built from their sources).

Ports: the pages use 8000 (the mock server) and 4318 (a collector); the test puts free
loopback ports in their place, so nothing leaves the machine and runs do not collide.
"""

from __future__ import annotations

import inspect
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib

import llm_latency
from llm_latency import semconv

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent

FENCE = re.compile(r"^```(\S*)\n(.*?)^```$", re.S | re.M)
DIRECTIVE = re.compile(r"<!-- example: ([a-z-]+)(?: (.*?))? -->\n$")


@dataclass
class Block:
    kind: str
    argument: str
    language: str
    body: str
    line: int


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks with their directives; a block without one fails."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()]
        directive = DIRECTIVE.search(before[-200:])
        assert directive is not None, f"{page.name}:{line}: a code block without a directive"
        kind, argument = directive.group(1), directive.group(2) or ""
        found.append(Block(kind, argument, match.group(1), match.group(2), line))
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def normalise(text: str) -> list[str]:
    """Words of ``text`` with durations, ids and ports made generic, so that a page's excerpt
    and a fresh run compare; line breaks (the console's wrapping) do not count."""
    text = text.replace("\u00a0", " ")
    text = re.sub(r"[█░▒]+", " <bar> ", text)
    text = re.sub(r"-?\d+(?:\.\d+)? ?(?:µs|ms|s)\b", "<t>", text)
    text = re.sub(r"\b\d+(?:\.\d+)?%", "<pct>", text)
    text = re.sub(r"req_[0-9a-f]+", "req_<id>", text)
    text = re.sub(r"\b[0-9a-f]{16,32}\b", "<id>", text)
    text = re.sub(r"(127\.0\.0\.1|localhost|\.test):\d+", r"\1:<port>", text)
    return text.split()


def matches(expected: str, actual: str) -> bool:
    """Whether ``actual`` shows ``expected``: its words in order, ``...`` lines for any."""
    parts = [normalise(part) for part in re.split(r"^\.\.\.$", expected, flags=re.M)]
    words = normalise(actual)
    position = 0
    for number, part in enumerate(parts):
        if not part:
            continue
        n = len(part)
        starts = range(position, len(words) - n + 1)
        if number == 0 and not expected.startswith("..."):
            starts = range(0, 1)
        found = next((i for i in starts if words[i : i + n] == part), None)
        if found is None:
            return False
        position = found + n
    return expected.rstrip().endswith("...") or position == len(words)


def environment(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", COLUMNS="100", HOME=str(work))
    env.pop("VIRTUAL_ENV", None)
    return env


def wait_for_port(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, "the background command ended"
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    pytest.fail(f"nothing listens on {port}")


def extras() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(project["optional-dependencies"])


def check_install(body: str) -> None:
    for line in body.splitlines():
        command = line.split("#", 1)[0].strip()
        if not command or command.startswith("python3 -m venv"):
            continue
        words = shlex.split(command)
        assert words[:2] == ["pip", "install"], line
        for word in words[2:]:
            spec = re.fullmatch(r"(llm-latency|\.)\[([a-z0-9,]+)\]", word)
            if spec:
                assert set(spec.group(2).split(",")) <= extras(), line
            else:
                assert re.fullmatch(r"[a-z0-9-]+", word), line  # another package, by name


def check_make(body: str) -> None:
    makefile = (ROOT / "Makefile").read_text()
    for line in body.splitlines():
        command = line.split("#", 1)[0].strip()
        target = command.split()[1]
        assert command.split()[0] == "make", line
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"no target {target}"


def check_signature(name: str, body: str) -> None:
    function = getattr(llm_latency, name.removeprefix("llm_latency."))
    parameters = inspect.signature(function).parameters.values()
    shown = re.sub(r"\s+", "", body)
    expected = ",".join(
        ("*," if p.kind is p.KEYWORD_ONLY and i == 0 else "") + f"{p.name}={p.default!r}"
        for i, p in enumerate(parameters)
    )
    assert shown == f"{name}({expected})", shown


def check_sketch(body: str) -> None:
    values = vars(semconv).values()
    known = {v for v in values if isinstance(v, str)}
    known |= {v for t in values if isinstance(t, tuple) for v in t if isinstance(v, str)}
    for name in re.findall(r"\b(?:http|retry|llm_latency|gen_ai)\.[a-z_.]*[a-z_]", body):
        assert name in known, f"{name} is not a name of llm_latency.semconv"


def run_page(page: Path, work: Path) -> Iterator[tuple[Block, dict[str, str]]]:
    """Run the page's blocks in order; yield each ``output`` block with the runs so far."""
    ports = {"8000": str(free_port()), "4318": str(free_port())}

    def localise(text: str) -> str:
        for port, free in ports.items():
            text = re.sub(rf"\b{port}\b", free, text)
        return text

    env = environment(work)
    (work / "examples").symlink_to(ROOT / "examples")  # the pages run in a checkout
    outputs: dict[str, str] = {}
    background: list[subprocess.Popen[bytes]] = []
    try:
        for block in blocks(page):
            body = localise(block.body)
            if block.kind == "file":
                (work / block.argument).write_text(body)
            elif block.kind == "background":
                process = subprocess.Popen(
                    ["bash", "-c", f"exec {body}"], cwd=work, env=env,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                background.append(process)
                wait_for_port(int(ports["8000"]), process)
            elif block.kind == "run":
                script = re.sub(r"^pip install ", "pip install -q --no-index ", body, flags=re.M)
                result = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", script], cwd=work, env=env,
                    capture_output=True, text=True, timeout=180, check=False,
                )  # fmt: skip
                output = result.stdout + result.stderr
                assert result.returncode == 0, f"{page.name}:{block.line}: {output}"
                if block.argument:
                    outputs[block.argument] = output
            elif block.kind == "output":
                yield block, outputs
            elif block.kind == "install":
                check_install(block.body)
            elif block.kind == "make":
                check_make(block.body)
            elif block.kind == "signature":
                check_signature(block.argument, block.body)
            elif block.kind == "sketch":
                check_sketch(block.body)
            elif block.kind == "not-run":
                assert block.argument == "docker", block.argument
                assert all(line.startswith("docker ") for line in block.body.splitlines())
            else:
                pytest.fail(f"{page.name}:{block.line}: unknown directive {block.kind}")
    finally:
        for process in background:
            process.terminate()
            process.wait(timeout=10)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_example_runs_and_shows_what_it_prints(page: Path, tmp_path: Path) -> None:
    checked = []
    # The outputs are compared once every run is done: an excerpt may come before its run.
    pending = list(run_page(page, tmp_path))
    for block, outputs in pending:
        assert block.argument in outputs, f"{page.name}:{block.line}: no run {block.argument}"
        shown = outputs[block.argument]
        assert matches(block.body, shown), f"{page.name}:{block.line}: the run printed\n{shown}"
        checked.append(block.argument)
    assert len(checked) == len(pending)


def test_the_quick_start_installs_from_the_checkout_and_names_make_demo_and_test() -> None:
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Install", 1)[1].split("\n## What you get", 1)[0]
    assert "pip install '.[otlp" in quick
    development = readme.split("## Development", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"^make demo\b", development, re.M)
    assert re.search(r"^make test\b", development, re.M)
    assert development.index("make demo") < development.index("make test")
    assert len(readme.splitlines()) < 300
    # A newcomer's first screen: the two commands, near the top.
    first_screen = "\n".join(readme.splitlines()[:60])
    assert re.search(r"^make demo\b", first_screen, re.M)
    assert re.search(r"^make test\b", first_screen, re.M)


def test_the_matcher_fails_on_a_different_output() -> None:
    shown = "a 12.5 ms\nb req_0123abcd 3 µs\nc\n"
    assert matches("a 1 ms b req_ff 4 ms\nc", shown)
    assert matches("...\nb req_1 9 s\n...", shown)
    assert not matches("a 1 ms\nc", shown)  # a line missing in between
    assert not matches("b req_1 1 ms", shown)  # not from the start, with no "..."
    assert not matches("a 1 ms b req_1 1 ms c d", shown)
