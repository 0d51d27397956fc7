"""Does a busy dashboard slow the workers? No-op throughput with and without a dashboard whose
pages are loaded every second, interleaved (see the README's Dashboard section).

    scripts/bench web                      # 20,000 runs, -n 4, 3 rounds
    scripts/bench web --runs 500 --rounds 1  # a smoke run (not for figures)

Each round drains the same number of no-op runs with ``supervisor start -n W --drain`` twice:
once alone, once while ``supervisor web`` serves the same database and a client loads the
overview (counts and the last hour's chart), the runs list and the live leases every second,
as an operator's open tabs would. The order alternates per round; medians are reported, with
the dashboard's own answer times under that load.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import bench_args
from bench_store import bulk_runs, new_db, pct

from workerproc.store import open_store

HERE = Path(__file__).resolve().parent
PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
PAGES = ("/", "/runs", "/leases")


class Operator(threading.Thread):
    """Loads every page of ``PAGES`` once a second until stopped; keeps the answer times."""

    def __init__(self, url: str, every: float) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.every = every
        self.times: list[float] = []
        self.errors = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            started = time.monotonic()
            for page in PAGES:
                t0 = time.perf_counter()
                try:
                    with urllib.request.urlopen(self.url + page.lstrip("/"), timeout=30) as r:
                        r.read()
                    self.times.append(time.perf_counter() - t0)
                except OSError:
                    self.errors += 1
            self.halt.wait(max(0.0, self.every - (time.monotonic() - started)))


def dashboard(db: str, tmp: str) -> tuple[subprocess.Popen[bytes], str]:
    out = Path(tmp) / f"web-{time.monotonic_ns()}.out"
    with open(out, "wb") as fh:
        cmd = [PY, "-m", "supervisor", "web", "--db", db, "--port", "0"]
        proc = subprocess.Popen(cmd, cwd=HERE, env=ENV, stdout=fh, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = re.search(r"dashboard on (http://\S+/)", out.read_text())
        if found:
            return proc, found.group(1)
        if proc.poll() is not None:
            raise SystemExit(f"supervisor web exited {proc.returncode}")
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("supervisor web did not print its URL within 30 s")


def drain(tmp: str, runs: int, workers: int, with_dashboard: bool) -> tuple[float, list[float]]:
    """Runs per second for one drain; the dashboard's answer times if it was there."""
    db = new_db(tmp, f"web-{int(with_dashboard)}-{time.monotonic_ns()}")
    bulk_runs(db, runs, time.time() - 1)
    web, operator = None, None
    if with_dashboard:
        web, url = dashboard(db, tmp)
        operator = Operator(url, 1.0)
        operator.start()
    cmd = [PY, "-m", "supervisor", "start", "-n", str(workers), "--db", db,
           "--app", "benchapp:app", "--drain"]  # fmt: skip
    started = time.monotonic()
    code = subprocess.run(cmd, cwd=HERE, env=ENV, stderr=subprocess.DEVNULL, check=False)
    elapsed = time.monotonic() - started
    times: list[float] = []
    if operator is not None and web is not None:
        operator.halt.set()
        operator.join(60)
        web.terminate()
        web.wait(30)
        times = operator.times
        if operator.errors:
            raise SystemExit(f"the dashboard failed {operator.errors} requests")
    store = open_store(db)
    done = store.stats().runs.get("succeeded", 0)
    store.close()
    if code.returncode != 0 or done != runs:
        raise SystemExit(f"drain: exit {code.returncode}, {done} of {runs} runs succeeded")
    return runs / elapsed, times


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``scripts/bench web``."""
    parser.add_argument("--runs", type=int, default=20_000, help="no-op runs per drain")
    parser.add_argument("--workers", type=int, default=4, help="-n for supervisor start")
    parser.add_argument("--rounds", type=int, default=3, help="drains of each kind")
    bench_args.add_dir(parser, "where to put the databases (default: a temp dir)")


def run(args: argparse.Namespace) -> int:
    if not (1 <= args.runs <= 10_000_000 and 1 <= args.workers <= 64 and 1 <= args.rounds <= 20):
        args.parser.error("--runs 1..10,000,000, --workers 1..64, --rounds 1..20")
    alone, busy, answers = [], [], []
    with tempfile.TemporaryDirectory(prefix="lk-bench-web-", dir=args.dir) as tmp:
        for k in range(args.rounds):
            for with_dashboard in (k % 2 == 1, k % 2 == 0):  # alternate who goes first
                rate, times = drain(tmp, args.runs, args.workers, with_dashboard)
                (busy if with_dashboard else alone).append(rate)
                answers += times
                print(f"... round {k + 1}: {'with' if with_dashboard else 'without'} the "
                      f"dashboard {rate:,.0f} runs/s", file=sys.stderr, flush=True)  # fmt: skip
    a, b = statistics.median(alone), statistics.median(busy)
    print(f"\n### dashboard load ({os.cpu_count()} CPUs, {args.runs:,} no-op runs, "
          f"-n {args.workers}, median of {args.rounds})\n")  # fmt: skip
    print("| no-op throughput | runs/s |")
    print("| --- | ---: |")
    print(f"| without a dashboard | {a:,.0f} |")
    print(f"| with {len(PAGES)} pages loaded every second | {b:,.0f} |")
    print(f"| ratio | {b / a:.2f}x |")
    if answers:
        p50, p99 = pct(answers, 0.5) * 1000, pct(answers, 0.99) * 1000
        print(f"\ndashboard answers under load: {len(answers)} pages, p50 {p50:.1f} ms, "
              f"p99 {p99:.1f} ms")  # fmt: skip
    return 0
