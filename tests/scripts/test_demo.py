"""The README's first command stays true: the demo runs the whole story on a small scale."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workerproc.store import open_store

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def test_demo_processes_everything_under_chaos_and_charges_nothing_twice(tmp_path: Path):
    db = tmp_path / "demo.db"
    cmd = [sys.executable, "demo.py", "--runs", "40", "--workers", "4", "--ttl", "0.5",
           "--interval", "0.3", "--db", str(db)]  # fmt: skip
    out = subprocess.run(cmd, cwd=SCRIPTS, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "tokens charged twice     0" in out.stdout
    assert "tokens saved by reuse" in out.stdout  # the model is called inside ctx.once
    counted = re.search(r"^  paid calls +(\d+) started, (\d+) kept, (\d+) reused, (\d+) paid "
                        r"again, (\d+) unknown", out.stdout, re.MULTILINE)  # fmt: skip
    assert counted, out.stdout
    started, answered, _, again, _ = map(int, counted.groups())
    assert started >= answered >= 1 and started >= again  # each call counted when it starts
    with open_store(str(db)) as kept:
        calls = [c for r in kept.list_runs(limit=100) for c in kept.paid_calls(r.id)]
    assert calls and all(c.name == "model" for c in calls)
    report = json.loads((tmp_path / "demo-chaos.json").read_text())
    assert report["ok"] and sum(report["faults"].values()) >= 1
    store = open_store(str(db))
    runs = store.list_runs(limit=100)
    store.close()
    assert len(runs) == 40 and all(r.terminal for r in runs)
    # chaos this dense may spend all 5 attempts of an unlucky step: that, and only that
    exhausted = "task_attempts_exhausted"
    assert all(r.status == "succeeded" or r.failure_reason == exhausted for r in runs)
    assert sum(r.status == "succeeded" for r in runs) >= 30
    ignored_by_git(sorted(p.name for p in tmp_path.iterdir()))


def ignored_by_git(names: list[str]) -> None:
    """``scripts/demo`` writes these beside ./demo.db: git must ignore every one, so the demo
    leaves a clone clean (the -wal, -shm, .lock and -producers files and the chaos report)."""
    assert {"demo.db", "demo.db-producers", "demo-chaos.json"} <= set(names), names
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for name in names:
        check = subprocess.run([git, "check-ignore", "--no-index", "-q", name], cwd=ROOT)
        assert check.returncode == 0, f"scripts/demo would leave {name} untracked in git"
