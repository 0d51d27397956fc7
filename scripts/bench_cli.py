"""The CLI's answer time and the pool's start-up (``scripts/bench cli``).

Each one-run command (``--version``, ``--help``, ``enqueue``, ``show``, ``signal``, ``cancel``,
``retry``) is run ``--samples`` times as a new process on an idle SQLite database, as a user
runs it: from ``start`` to exit, wall clock, the interpreter's own start-up (``python -c
pass``) printed beside. Then ``supervisor start -n 2 --drain`` on a database with one run, from
launch to exit, and its first claim (the run's handler records when it began): from launch,
and from the pool's start (the supervisor's "supervisor started" line, just before its first
fork). The bytecode caches are written by a first, unmeasured call of each (an
installed package has them; a checkout run with ``PYTHONDONTWRITEBYTECODE`` would compile every
module at every call). Last, the ten slowest imports of ``signal`` (``python -X importtime``)
and how many modules each command loads.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import closing
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOAL_CLI = 0.150  # seconds: a one-run command on an idle SQLite database
GOAL_DRAIN = 0.25  # seconds: supervisor start -n 2 --drain on one run
GOAL_FIRST_CLAIM = 0.150  # seconds: the pool's first claim after its start (its first fork)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--samples", type=int, default=20, help="calls per command (default 20)")


def _env(tree: str = ROOT) -> dict[str, str]:
    """The environment that runs ``tree``'s code (this checkout's, or an earlier commit's)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = tree + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _timed(argv: list[str], cwd: str, stderr: Any = subprocess.DEVNULL, tree: str = ROOT) -> float:
    """Launch to exit, wall clock. The wait is a blocking ``waitpid``, bounded by a timer that
    kills the process: ``subprocess.run(timeout=...)`` polls with sleeps growing to 50 ms, and
    so rounded every time up to its next poll (114, 164, 214 ... ms)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=_env(tree), stdout=subprocess.DEVNULL,
                            stderr=stderr)  # fmt: skip
    bound = threading.Timer(120, proc.kill)
    bound.start()
    try:
        proc.wait()
    finally:
        bound.cancel()
    return time.perf_counter() - started


def _drain(sv: list[str], db: str, tree: str = ROOT) -> tuple[float, float, float]:
    """A one-run ``start -n 2 --drain`` of ``tree``'s code: launch to exit, launch to the run's
    handler, and the pool's start (its "supervisor started" log line) to the run's handler, in
    seconds. The run is read with sqlite3 alone: this process's store may be another tree's."""
    away = os.path.dirname(db)  # (``-m`` puts the working directory first: not a checkout)
    subprocess.run([*sv, "migrate", "--db", db], env=_env(tree), check=True, capture_output=True,
                   cwd=away)  # fmt: skip
    made = subprocess.run([*sv, "enqueue", "stamp", "--db", db], env=_env(tree), check=True,
                          capture_output=True, text=True, cwd=away)  # fmt: skip
    run_id = int(made.stdout.split()[-1])
    with tempfile.TemporaryFile("w+") as log:
        launched = time.time()
        took = _timed([*sv, "start", "-n", "2", "--drain", "--db", db, "--app", "benchapp:app"],
                      os.path.join(ROOT, "scripts"), stderr=log, tree=tree)  # fmt: skip
        log.seek(0)
        text = log.read()
    started = next((line for line in text.splitlines() if "supervisor started" in line), None)
    if started is None:
        raise SystemExit(f"{tree}: the one-run pool did not start:\n{text[-3000:]}")
    stamp = started.split(" supervisor[")[0]  # e.g. 2026-12-05 15:43:41,142 (local time)
    pool_at = time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")) + int(stamp[20:]) / 1000
    with closing(sqlite3.connect(db)) as conn:
        row = conn.execute("SELECT status, result FROM runs WHERE id = ?", (run_id,)).fetchone()
    assert row is not None and row[0] == "succeeded", f"run {run_id} did not succeed: {row}"
    began = float(json.loads(row[1]))  # (benchapp's stamp: its handler's start, time.time())
    return took, began - launched, began - pool_at


def _row(name: str, samples: list[float], goal: float | None) -> str:
    p50 = statistics.median(samples)
    p90 = sorted(samples)[max(0, int(len(samples) * 0.9) - 1)]
    verdict = "" if goal is None else ("met" if p50 <= goal else "**NOT met**")
    goal_text = "" if goal is None else f"{goal * 1000:.0f}"
    return f"| {name} | {p50 * 1000:.0f} | {p90 * 1000:.0f} | {goal_text} | {verdict} |"


def _modules(argv: list[str], cwd: str) -> tuple[int, list[str]]:
    """How many modules ``argv`` loads, and its ten slowest imports (cumulative)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv[1:]], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    rows = [
        line.removeprefix("import time:").split("|")
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    ][1:]
    timed = sorted((int(cumulative), name.strip()) for _, cumulative, name in rows)
    return len(rows), [f"{us / 1000:7.1f} ms  {name}" for us, name in timed[-10:][::-1]]


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.samples <= 1000:
        args.parser.error("--samples must be 1 to 1000")
    with tempfile.TemporaryDirectory(prefix="lk-bench-cli-") as tmp:
        db = os.path.join(tmp, "cli.db")
        sv = [sys.executable, "-m", "supervisor"]
        subprocess.run([*sv, "migrate", "--db", db], env=_env(), check=True, capture_output=True)
        made = subprocess.run([*sv, "enqueue", "noop", "--db", db], env=_env(), check=True,
                              capture_output=True, text=True)  # fmt: skip
        run_id = made.stdout.split()[-1]
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "--version": [*sv, "--version"],
            "--help": [*sv, "--help"],
            "enqueue": [*sv, "enqueue", "noop", "--db", db],
            "show": [*sv, "show", run_id, "--db", db],
            "signal": [*sv, "signal", run_id, "go", "--db", db],
            "cancel": [*sv, "cancel", "999999999", "--db", db],
            "retry": [*sv, "retry", "999999999", "--db", db],
        }
        for argv in commands.values():  # the bytecode caches, written once, unmeasured
            _timed(argv, tmp)
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.samples):  # interleaved: a slow moment hits every command alike
            for name, argv in commands.items():
                times[name].append(_timed(argv, tmp))
        print("\n| command | p50 ms | p90 ms | goal ms | |")
        print("|---|---:|---:|---:|---|")
        for name, samples in times.items():
            print(_row(name, samples, None if name.startswith("python") else GOAL_CLI))
        drains = [_drain(sv, os.path.join(tmp, f"drain{k}.db"))
                  for k in range(max(3, args.samples // 4))]  # fmt: skip
        print(_row("start -n 2 --drain, one run", [d[0] for d in drains], GOAL_DRAIN))
        print(_row("... its first claim, from launch", [d[1] for d in drains], None))
        print(_row("... its first claim, from the pool's start", [d[2] for d in drains],
                   GOAL_FIRST_CLAIM))  # fmt: skip
        print(f"\nload average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print("\nmodules loaded, and signal's ten slowest imports (cumulative):")
        for name in ("--version", "--help", "show", "signal"):
            count, top = _modules(commands[name], tmp)
            print(f"  {name}: {count} modules")
        for line in top:
            print(f"    {line}")
    return 0
