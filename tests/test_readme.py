"""The README's reference tables are generated from the code's declarations: a change to an
option, a range or an exit code that is not written back into README.md fails here (run
``scripts/readme-tables`` to rewrite them)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from supervisor.commands.reference import TABLES, names_in, render

README = Path(__file__).resolve().parent.parent / "README.md"


def test_every_generated_table_is_in_the_readme() -> None:
    assert names_in(README.read_text(encoding="utf-8")) == set(TABLES)


def test_the_readme_tables_match_the_declarations() -> None:
    text = README.read_text(encoding="utf-8")
    assert render(text) == text, "README.md tables are stale: run scripts/readme-tables"


def test_a_changed_declaration_makes_the_tables_stale() -> None:
    text = README.read_text(encoding="utf-8")
    tampered = text.replace("| `--lease-ttl S` | `SUPERVISOR_LEASE_TTL` | 60 |", "| x | y | 1 |")
    assert tampered != text
    assert render(tampered) == text


def example(name: str) -> str:
    """The fenced block that follows ``<!-- example: NAME -->`` in the README."""
    text = README.read_text(encoding="utf-8")
    marker = f"<!-- example: {name} -->\n```"
    start = text.index(marker) + len(marker)
    start = text.index("\n", start) + 1
    return text[start : text.index("```", start)]


def test_the_handler_example_runs_as_written(tmp_path: Path) -> None:
    """README's "Writing handlers": its myapp.py and its shell lines, exactly as written."""
    (tmp_path / "myapp.py").write_text(example("myapp.py"))
    supervisor = shutil.which("supervisor")
    assert supervisor, "the supervisor console script is not on PATH"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERVISOR_")}
    outputs = []
    for line in example("shell").splitlines():
        argv = shlex.split(line, comments=True)
        assert argv[0] == "supervisor"
        done = subprocess.run(
            [supervisor, *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    assert outputs[0].strip() == "1"
    assert "succeeded" in outputs[-1] and '"tokens": 4' in outputs[-1], outputs[-1]
