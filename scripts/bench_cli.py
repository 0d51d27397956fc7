"""The CLI's answer time and the pool's start-up (``scripts/bench cli``).

Each one-run command (``--version``, ``--help``, ``enqueue``, ``show``, ``signal``, ``cancel``,
``retry``) is run ``--samples`` times as a new process on an idle SQLite database, as a user
runs it: from ``start`` to exit, wall clock, the interpreter's own start-up (``python -c
pass``) printed beside. Then ``supervisor start -n 2 --drain`` on a database with one run, from
launch to exit. The bytecode caches are written by a first, unmeasured call of each (an
installed package has them; a checkout run with ``PYTHONDONTWRITEBYTECODE`` would compile every
module at every call). Last, the ten slowest imports of ``signal`` (``python -X importtime``)
and how many modules each command loads.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOAL_CLI = 0.150  # seconds: a one-run command on an idle SQLite database
GOAL_DRAIN = 0.25  # seconds: supervisor start -n 2 --drain on one run


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--samples", type=int, default=20, help="calls per command (default 20)")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _timed(argv: list[str], cwd: str) -> float:
    """Launch to exit, wall clock. The wait is a blocking ``waitpid``, bounded by a timer that
    kills the process: ``subprocess.run(timeout=...)`` polls with sleeps growing to 50 ms, and
    so rounded every time up to its next poll (114, 164, 214 ... ms)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    bound = threading.Timer(120, proc.kill)
    bound.start()
    try:
        proc.wait()
    finally:
        bound.cancel()
    return time.perf_counter() - started


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
        drains = []
        for k in range(max(3, args.samples // 4)):
            drain_db = os.path.join(tmp, f"drain{k}.db")
            subprocess.run([*sv, "migrate", "--db", drain_db], env=_env(), check=True,
                           capture_output=True)  # fmt: skip
            subprocess.run([*sv, "enqueue", "noop", "--db", drain_db], env=_env(), check=True,
                           capture_output=True)  # fmt: skip
            drains.append(
                _timed(
                    [*sv, "start", "-n", "2", "--drain", "--db", drain_db, "--app", "benchapp:app"],
                    os.path.join(ROOT, "scripts"),
                )
            )
        print(_row("start -n 2 --drain, one run", drains, GOAL_DRAIN))
        print("\nmodules loaded, and signal's ten slowest imports (cumulative):")
        for name in ("--version", "--help", "show", "signal"):
            count, top = _modules(commands[name], tmp)
            print(f"  {name}: {count} modules")
        for line in top:
            print(f"    {line}")
    return 0
