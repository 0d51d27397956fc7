"""No-op throughput, idle pickup and takeover: this checkout against an earlier commit, on this
machine, now.

"No worse than today" (issue 12) needs the figures of the code before slots measured on the same
machine in the same minutes: idle latency here depends on how fast an idle machine wakes up (a
``SELECT 1`` after 0.3 s of idle can take 50x its warm time), so figures from another day or
machine compare nothing. This script checks ``REV`` out into a temporary worktree, drains the
same no-op runs with each tree's pool (``-n 8``, then ``-n 2 --concurrency 16``; each tree
makes its own database, so each has its own schema), alternating who goes first, starts both
pools at once (``supervisor start -n 8``, one database each) and alternates idle pickup samples
between them, then measures takeover after SIGKILL with each tree's own
``scripts/measure_fast_release.py``, alternating rounds.

    .venv/bin/python scripts/bench_before.py 524312a [--samples 120] [--trials 12]

(about 9 minutes; 524312a is the last commit before slots).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_procs import drain, tree_env

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "524312a"  # the last commit before slots (issue 12)
ENQUEUE = """import sys, time
from workerproc.store import open_store
store = open_store(sys.argv[1])
for _ in sys.stdin:
    t0 = time.time()
    print(t0, store.start_run("stamp"), flush=True)
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Pool:
    """``supervisor start -n 8`` of one tree on its own database, and a producer beside it."""

    def __init__(self, tree: Path, work: Path, name: str) -> None:
        self.db = str(work / f"{name}.db")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(tree / "scripts")]))
        cmd = [sys.executable, "-m", "supervisor", "start", "-n", "8", "--db", self.db,
               "--app", "benchapp:app"]  # fmt: skip
        self.proc = subprocess.Popen(cmd, cwd=tree / "scripts", env=env, stderr=subprocess.DEVNULL)
        # cwd: ``python -c`` puts it first on sys.path, ahead of PYTHONPATH
        self.producer = subprocess.Popen([sys.executable, "-c", ENQUEUE, self.db], cwd=tree,
                                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True)  # fmt: skip

    def sample(self) -> float:
        """Enqueue one run into the idle pool; ms until its handler started."""
        assert self.producer.stdin is not None and self.producer.stdout is not None
        self.producer.stdin.write("\n")
        self.producer.stdin.flush()
        t0, run_id = self.producer.stdout.readline().split()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with sqlite3.connect(self.db, timeout=5) as conn:
                row = conn.execute("SELECT status, result FROM runs WHERE id = ?",
                                   (int(run_id),)).fetchone()  # fmt: skip
            if row is not None and row[0] == "succeeded":
                return (float(json.loads(row[1])) - float(t0)) * 1000
            time.sleep(0.001)
        raise SystemExit(f"{self.db}: run {run_id} did not finish within 60 s")

    def stop(self) -> None:
        if self.producer.stdin is not None:
            self.producer.stdin.close()
        self.producer.wait(30)
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def pickup(trees: dict[str, Path], work: Path, samples: int) -> dict[str, list[float]]:
    pools = {name: Pool(tree, work, name) for name, tree in trees.items()}
    out: dict[str, list[float]] = {name: [] for name in trees}
    rng = random.Random(7)
    try:
        time.sleep(4)  # up, then idle
        for i in range(samples):
            for name in list(pools)[:: 1 if i % 2 else -1]:  # alternate who goes first
                time.sleep(rng.uniform(0.2, 1.0))
                out[name].append(pools[name].sample())
    finally:
        for pool in pools.values():
            pool.stop()
    return out


SHAPES = (("-n", "8"), ("-n", "2", "--concurrency", "16"))
MAKE_DB = """import sys, time
from bench_store import bulk_runs
from workerproc.store import open_store
open_store(sys.argv[1]).close()
bulk_runs(sys.argv[1], int(sys.argv[2]), time.time() - 1)"""


def throughput(
    trees: dict[str, Path], work: Path, m: int, rounds: int
) -> dict[str, dict[str, list[float]]]:
    """No-op runs/s per shape and tree: ``m`` runs drained, ``rounds`` times, order alternating."""
    out: dict[str, dict[str, list[float]]] = {}
    shapes = [s for s in SHAPES if all(supports(tree, s) for tree in trees.values())]
    for r in range(rounds):
        for shape in shapes:
            per = out.setdefault(" ".join(shape), {name: [] for name in trees})
            for name in list(trees)[:: 1 if r % 2 else -1]:
                db = str(work / f"tp-{name}-{r}-{len(per[name])}-{shape[1]}.db")
                # each tree's own store and bulk insert: each has its own schema
                subprocess.run([sys.executable, "-c", MAKE_DB, db, str(m)],
                               cwd=trees[name] / "scripts", env=tree_env(trees[name]),
                               check=True)  # fmt: skip
                seconds = drain(db, m, f"sqlite:///{db}", shape, tree=trees[name])
                per[name].append(m / seconds)
    return out


def supports(tree: Path, shape: tuple[str, ...]) -> bool:
    """Whether that tree's ``supervisor start`` takes every option of ``shape`` (a commit from
    before slots has no ``--concurrency``)."""
    done = subprocess.run([sys.executable, "-m", "supervisor", "start", "--help"], cwd=tree,
                          env=tree_env(tree), capture_output=True, text=True)  # fmt: skip
    return all(opt in done.stdout for opt in shape if opt.startswith("--"))


def takeover(trees: dict[str, Path], trials: int, rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(rounds):
        for name, tree in trees.items():
            cmd = [sys.executable, "scripts/measure_fast_release.py", "--trials", str(trials),
                   "-v"]  # fmt: skip
            done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, check=True)
            out[name] += [float(ms) for ms in re.findall(r"claim ([\d.]+) ms", done.stderr)]
    return out


# "pickup" / "takeover" -> "before" / "now" -> ms; "runs/s <shape>" -> "before" / "now" -> runs/s
Before = dict[str, dict[str, list[float]]]


def exists(rev: str) -> bool:
    probe = ["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"]
    return subprocess.run(probe, cwd=ROOT, capture_output=True).returncode == 0


def measure(rev: str, samples: int, trials: int, rounds: int, tasks: int = 20_000) -> Before:
    with tempfile.TemporaryDirectory(prefix="lk-before-") as tmp:
        work = Path(tmp)
        before = work / "before"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(before), rev],
                       cwd=ROOT, check=True)  # fmt: skip
        try:
            trees = {"before": before, "now": ROOT}
            print(f"  no-op throughput against {rev}: {tasks:,} runs, {rounds + 1} rounds ...",
                  file=sys.stderr, flush=True)  # fmt: skip
            runs = throughput(trees, work, tasks, rounds + 1)
            print(f"  idle pickup against {rev}: {samples} samples each, alternating ...",
                  file=sys.stderr, flush=True)  # fmt: skip
            lat = pickup(trees, work, samples)
            print(f"  takeover against {rev}: {rounds} x {trials} trials each ...",
                  file=sys.stderr, flush=True)  # fmt: skip
            took = takeover(trees, trials, rounds)
        finally:
            removed = subprocess.run(["git", "worktree", "remove", "--force", str(before)],
                                     cwd=ROOT, check=False).returncode == 0  # fmt: skip
    if not removed:  # another git command held the repository's lock: forget the stale entry
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, check=False)
    return {"pickup": lat, "takeover": took, **{f"runs/s {k}": v for k, v in runs.items()}}


def table(rev: str, data: Before) -> list[str]:
    short = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    lines = [f"| p50 / p99 (ms), same machine, same run | before ({short}) | now "
             "| now / before |", "| --- | ---: | ---: | ---: |"]  # fmt: skip
    for label, key in (("idle pickup, -n 8", "pickup"),
                       ("takeover after SIGKILL, fast release", "takeover")):  # fmt: skip
        b, n = data[key]["before"], data[key]["now"]
        row = [f"{statistics.median(v):.1f} / {pct(v, 0.99):.1f}" for v in (b, n)]
        ratio = (f"{statistics.median(n) / statistics.median(b):.2f}x / "
                 f"{pct(n, 0.99) / pct(b, 0.99):.2f}x")  # fmt: skip
        lines.append(f"| {label} | {row[0]} | {row[1]} | {ratio} |")
    lines += ["", f"| no-op runs/s, median, same machine, same run | before ({short}) | now "
              "| now / before |", "| --- | ---: | ---: | ---: |"]  # fmt: skip
    for key in (k for k in data if k.startswith("runs/s ")):
        b, n = statistics.median(data[key]["before"]), statistics.median(data[key]["now"])
        lines.append(f"| {key.removeprefix('runs/s ')} | {b:,.0f} | {n:,.0f} | {n / b:.2f}x |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="the earlier commit (524312a: the last one before slots)")
    ap.add_argument("--samples", type=int, default=120, help="idle pickup samples per tree")
    ap.add_argument("--trials", type=int, default=12, help="takeover trials per round")
    ap.add_argument("--rounds", type=int, default=2, help="takeover rounds per tree")
    ap.add_argument("--tasks", type=int, default=20_000, help="no-op runs per drain")
    args = ap.parse_args()
    if not exists(args.rev):
        raise SystemExit(f"bench_before: no commit {args.rev!r} in this clone")
    data = measure(args.rev, args.samples, args.trials, args.rounds, args.tasks)
    print()
    print("\n".join(table(args.rev, data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
