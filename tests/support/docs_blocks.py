"""The documentation's code blocks, run exactly as written.

Every fenced code block in README.md and docs/ follows one marker line that says what it is:

    <!-- file: NAME -->      a file the page has you write: it is saved as NAME
    <!-- run -->             commands to run: ``sh`` blocks with ``bash -e -o pipefail``, ``python``
                             blocks with ``python -c``; each must exit 0
    <!-- output -->          what the run block before it prints: each line of it must appear in
                             that block's standard output, in this order
    <!-- not run: WHY -->    not run by a test, and why (a config file of another program, a
                             command that needs root or a server of its own, a sample of output)

A page's blocks run in order, in one fresh directory, so a page holds all of its own set-up:
its files, its tables, its first enqueue. ``supervisor`` and ``python`` are whatever comes first
on PATH: the project's virtual environment under pytest (tests/docs/test_docs_examples.py), a fresh
one with the built wheel installed under ``scripts/wheel-check``, which runs this file directly:

    python tests/support/docs_blocks.py docs/tutorial.md [more pages]

Standard library only: the wheel check runs it with the wheel's own Python.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("file", "run", "output", "not run")
FENCE = re.compile(
    r"^(?P<indent>[ ]*)(?P<fence>`{3,}|~{3,})(?P<lang>[\w+-]*)[^\n]*\n"
    r"(?P<body>.*?)^(?P=indent)(?P=fence)[ ]*$",
    re.MULTILINE | re.DOTALL,
)
MARKER = re.compile(
    r"^[ ]*<!-- (?P<kind>file|run|output|not run)(?::[ ]*(?P<arg>[^\n]*?))?[ ]*-->[ ]*$"
)
SHELLS = ("sh", "bash", "shell")
TIMEOUT = 180.0  # seconds for one block: a pool that drains a page's runs needs a few


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    body: str
    kind: str | None  # one of KINDS, None when the marker is missing
    arg: str  # the file name of ``file``, the reason of ``not run``

    def where(self) -> str:
        try:
            name = self.page.relative_to(ROOT)
        except ValueError:
            name = self.page
        return f"{name}:{self.line}"


class PageFailed(AssertionError):
    pass


def documentation() -> list[Path]:
    """README.md and every page of the site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.match(before)
        body = "\n".join(part[len(m["indent"]) :] for part in m["body"].split("\n"))
        kind, arg = (marker["kind"], (marker["arg"] or "").strip()) if marker else (None, "")
        found.append(Block(page, line, m["lang"], body, kind, arg))
    return found


def problems(page: Path) -> list[str]:
    """Why the page's blocks cannot be run as the markers say (empty: they can)."""
    found = []
    previous: Block | None = None
    for block in blocks(page):
        where = block.where()
        if block.kind is None:
            found.append(
                f"{where}: a code block without a marker (<!-- run -->, <!-- not run: WHY -->…)"
            )
        elif block.kind == "file" and not re.fullmatch(r"[\w.-]+(/[\w.-]+)*", block.arg):
            found.append(f"{where}: <!-- file: NAME --> needs a relative file name")
        elif block.kind == "not run" and len(block.arg) < 10:
            found.append(f"{where}: <!-- not run: WHY --> must say why")
        elif block.kind == "run" and block.lang not in (*SHELLS, "python"):
            found.append(f"{where}: a run block must be sh or python, not {block.lang!r}")
        elif block.kind == "output" and (previous is None or previous.kind != "run"):
            found.append(f"{where}: an output block must follow a run block")
        previous = block
    return found


def runnable(page: Path) -> bool:
    return any(b.kind == "run" for b in blocks(page))


def run_page(page: Path, workdir: Path, env: Mapping[str, str]) -> int:
    """Run the page's blocks in order in ``workdir``; the number of run blocks that passed.
    Raises PageFailed naming the block that did not do what the page says. What a block left
    running in the background (a pool the next blocks operate) is killed when the page ends."""
    wrong = problems(page)
    if wrong:
        raise PageFailed("\n".join(wrong))
    last = ""
    ran = 0
    groups: list[int] = []
    try:
        for block in blocks(page):
            if block.kind == "file":
                target = workdir / block.arg
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block.body, encoding="utf-8")
            elif block.kind == "run":
                last = _run(block, workdir, env, groups)
                ran += 1
            elif block.kind == "output":
                _expect(block, last)
    finally:
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
    return ran


def _run(block: Block, workdir: Path, env: Mapping[str, str], groups: list[int]) -> str:
    """One block in a process group of its own (kept in ``groups``); its output goes to files,
    so a process it left in the background cannot hold the block open."""
    if block.lang == "python":
        python = shutil.which("python", path=env.get("PATH")) or sys.executable
        argv = [python, "-c", block.body]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.body]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            argv, cwd=workdir, env=dict(env), stdout=out, stderr=err, start_new_session=True
        )
        groups.append(proc.pid)
        try:
            code = proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            msg = f"{block.where()}: still running after {TIMEOUT:g}s:\n{block.body}"
            raise PageFailed(msg) from None
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if code != 0:
        raise PageFailed(
            f"{block.where()}: exit code {code}\n--- block\n{block.body}"
            f"--- stdout\n{stdout}--- stderr\n{stderr}"
        )
    return stdout


def _expect(block: Block, stdout: str) -> None:
    lines = [line.rstrip() for line in stdout.splitlines()]
    at = 0
    for wanted in (w.rstrip() for w in block.body.splitlines()):
        if not wanted:
            continue
        while at < len(lines) and wanted not in lines[at]:
            at += 1
        if at == len(lines):
            raise PageFailed(
                f"{block.where()}: {wanted!r} is not in the output (in order):\n{stdout}"
            )
        at += 1


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a reader's shell would have after activating the environment this runs
    in (its ``supervisor`` and ``python`` first on PATH), with no SUPERVISOR_* left over."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERVISOR_")}
    env.pop("JOURNAL_STREAM", None)
    env.pop("PYTHONPATH", None)
    here = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([here, *(p for p in env.get("PATH", "").split(os.pathsep) if p)])
    env.update(extra or {})
    return env


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    failed = 0
    for name in argv:
        page = Path(name).resolve()
        with tempfile.TemporaryDirectory(prefix="lk-docs-") as tmp:
            try:
                ran = run_page(page, Path(tmp), clean_env())
            except PageFailed as exc:
                print(f"FAIL {name}\n{exc}", file=sys.stderr)
                failed += 1
            else:
                print(f"PASS {name}: {ran} blocks ran as written")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
