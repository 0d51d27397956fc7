"""Where a no-op run's CPU goes at ``-n 2 --concurrency 16`` on SQLite (``scripts/bench profile``).

Two parts, each on its own database of ``--runs`` no-op runs (FULL, events on):

(a) the split: ``supervisor start -n 2 --concurrency 16 --drain``, its supervisor's and its
    workers' CPU (user + system, psutil, sampled until each exits) per run, beside the wall
    time: what the machine spends per run, and on whom;
(b) the profile: two standalone workers (``python -m workerproc --concurrency 16``, stopped
    by SIGTERM once every run succeeded), each under cProfile, their stats merged; printed: the
    share of the workers' time inside SQLite's C calls (``execute``, ``executemany``,
    ``commit``, ... of sqlite3's objects), the rest being Python, and the top functions by own
    time and by cumulative time.
    ``--out FILE`` keeps the merged stats (``python -m pstats FILE``).

cProfile slows Python code more than C calls, so (b) is for shares and for where, and (a) for
how much.
"""

from __future__ import annotations

import argparse
import io
import os
import pstats
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import closing

import psutil
from bench_procs import ENV, HERE, PY
from bench_store import bulk_runs, new_db


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--runs", type=int, default=30_000, help="no-op runs (30,000)")
    ap.add_argument("--top", type=int, default=25, help="functions listed (25)")
    ap.add_argument("--out", help="keep the merged cProfile stats in this file")


def split(tmp: str, m: int) -> dict[str, float]:
    db = new_db(tmp, "split")
    bulk_runs(db, m, time.time() - 1)
    cmd = [PY, "-m", "supervisor", "start", "-n", "2", "--concurrency", "16", "--db",
           f"sqlite:///{db}", "--app", "benchapp:app", "--drain"]  # fmt: skip
    began = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=HERE, env=ENV, stderr=subprocess.DEVNULL)
    parent = psutil.Process(proc.pid)
    cpu: dict[int, tuple[str, float]] = {}
    while proc.poll() is None:
        try:
            for p in [parent, *parent.children()]:
                t = p.cpu_times()
                cpu[p.pid] = ("supervisor" if p.pid == proc.pid else "worker", t.user + t.system)
        except psutil.Error:
            pass
        time.sleep(0.02)
    wall = time.monotonic() - began
    out = {"wall_us": wall / m * 1e6, "rate": m / wall}
    for who in ("supervisor", "worker"):
        out[f"{who}_us"] = sum(s for w, s in cpu.values() if w == who) / m * 1e6
    return out


SQLITE_CALLS = ("execute", "executemany", "executescript", "commit", "fetchone", "fetchall",
                "fetchmany", "rollback", "close", "connect", "__next__")  # fmt: skip


def done(db: str) -> int:
    with closing(sqlite3.connect(db, timeout=30)) as conn:
        return int(conn.execute("SELECT count(*) FROM runs WHERE status = 'succeeded'")
                   .fetchone()[0])  # fmt: skip


def profile(tmp: str, m: int, out: str | None) -> pstats.Stats:
    db = new_db(tmp, "profile")
    bulk_runs(db, m, time.time() - 1)
    files = [os.path.join(tmp, f"worker{k}.prof") for k in range(2)]
    procs = [subprocess.Popen([PY, "-m", "cProfile", "-o", f, "-m", "workerproc", "--db",
                               f"sqlite:///{db}", "--app", "benchapp:app", "--concurrency", "16",
                               "--log-level", "warning"],
                              cwd=HERE, env=ENV, stderr=subprocess.DEVNULL)
             for f in files]  # fmt: skip
    deadline = time.monotonic() + 900
    while done(db) < m and time.monotonic() < deadline:
        time.sleep(0.2)
    for p in procs:  # a graceful stop: the worker returns, and cProfile writes its stats
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(120)
    stats = pstats.Stats(*[f for f in files if os.path.exists(f)], stream=io.StringIO())
    if out:
        stats.dump_stats(out)
    return stats


def sqlite_share(stats: pstats.Stats) -> tuple[float, float]:
    """(seconds inside sqlite3's C calls, all profiled seconds) of the merged stats."""
    inside = total = 0.0
    for (filename, _, name), (_, _, tt, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        total += tt
        if filename == "~" and "sqlite3" in name and any(c in name for c in SQLITE_CALLS):
            inside += tt
    return inside, total


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="lk-profile-") as tmp:
        s = split(tmp, args.runs)
        stats = profile(tmp, args.runs, args.out)
    print(f"\n-n 2 --concurrency 16, {args.runs:,} no-op runs: {s['rate']:,.0f} runs/s, "
          f"{s['wall_us']:.0f} us wall a run; CPU a run: workers {s['worker_us']:.0f} us, "
          f"supervisor {s['supervisor_us']:.0f} us; load {os.getloadavg()[0]:.2f}")  # fmt: skip
    inside, total = sqlite_share(stats)
    print(f"profile (cProfile, two workers merged): {total:.1f} s profiled, {inside:.1f} s "
          f"({inside / total:.0%}) inside sqlite3's C calls, the rest Python\n")  # fmt: skip
    for order in ("tottime", "cumulative"):
        text = io.StringIO()
        stats.stream = text  # type: ignore[attr-defined]
        stats.sort_stats(order).print_stats(args.top)
        body = text.getvalue()
        print(body[body.find("   ncalls") :])
    sys.stdout.flush()
    return 0
