"""An idle pool's cost (``scripts/bench idle``): the CPU of processes that only wait, and memory.

CPU: ``supervisor start -n 2`` on an idle database (SQLite, then PostgreSQL unless
``--postgres ''``), its app declaring a schedule (the firer sleeps until the next tick) and one
webhook parked (its waker watches the database's changes). Once the webhook is parked, each
process's CPU time (user + system, psutil) over ``--window`` seconds, as % of one core, and its
threads' voluntary context switches per second (wake-ups, and calls that block on the
database). CPU time is the process's own: meaningful on a shared, loaded machine, where a
wall-clock figure is not; the load average is printed beside it.

Memory: RSS and USS (what the process alone holds) of the supervisor and its largest worker,
``supervisor start -n 8`` at one slot on SQLite, plain handlers (``benchapp_idle:app``).

Goals: an idle worker uses <= 0.3 % of a core; a worker <= 25 MB RSS at one slot, the
supervisor <= 30 MB at -n 8.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import bench_args
import psutil

from workerproc.store import open_store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "scripts")
GOAL_CPU = 0.3  # % of one core, per idle worker
GOAL_WORKER_RSS = 25.0  # MB, one slot
GOAL_SUPERVISOR_RSS = 30.0  # MB, -n 8


def add_arguments(ap: argparse.ArgumentParser) -> None:
    bench_args.add_postgres(ap)
    bench_args.add_quick(ap)
    bench_args.add_dir(ap)
    ap.add_argument("--window", type=float, help="seconds of CPU time measured (60; quick 5)")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERVISOR_")}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, HERE, env.get("PYTHONPATH", "")])
    return env


def _supervisor(*args: str) -> list[str]:
    return [sys.executable, "-m", "supervisor", *args]


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def receiver() -> Iterator[str]:
    """A webhook receiver that takes every delivery (200)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()


@contextlib.contextmanager
def pool(url: str, n: int, app: str) -> Iterator[psutil.Process]:
    proc = subprocess.Popen(_supervisor("start", "-n", str(n), "--db", url, "--app", app),
                            cwd=HERE, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        yield psutil.Process(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _workers(sup: psutil.Process, n: int) -> list[psutil.Process]:
    deadline = time.monotonic() + 60
    while len(kids := sup.children()) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    return kids


def _parked(url: str) -> bool:
    with open_store(url) as store:
        return all(hook.status == "waiting" for hook in store.webhooks())


def _sample(procs: list[psutil.Process]) -> dict[int, tuple[float, int]]:
    """Each process's CPU seconds and its threads' voluntary context switches so far."""
    out = {}
    for p in procs:
        t = p.cpu_times()
        switches = 0
        for thread in p.threads():
            with contextlib.suppress(OSError), open(f"/proc/{p.pid}/task/{thread.id}/status") as f:
                switches += next(int(line.split()[1]) for line in f
                                 if line.startswith("voluntary_ctxt_switches"))  # fmt: skip
        out[p.pid] = (t.user + t.system, switches)
    return out


def idle_cpu(kind: str, url: str, hook_url: str, window: float) -> list[str]:
    subprocess.run(_supervisor("migrate", "--db", url), env=_env(), check=True,
                   capture_output=True)  # fmt: skip
    subprocess.run(_supervisor("webhooks", "add", "idle", hook_url, "--db", url), env=_env(),
                   check=True, capture_output=True)  # fmt: skip
    rows = []
    with pool(url, 2, "benchapp_idle:scheduled") as sup:
        workers = _workers(sup, 2)
        deadline = time.monotonic() + 120
        while not _parked(url) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2.0)  # (the delivery's commit and the workers' claims settle)
        procs = [sup, *workers]
        load = os.getloadavg()[0]
        before, began = _sample(procs), time.monotonic()
        time.sleep(window)
        after, spent = _sample(procs), time.monotonic() - began
        for p in procs:
            cpu = (after[p.pid][0] - before[p.pid][0]) / spent * 100
            wakes = (after[p.pid][1] - before[p.pid][1]) / spent
            rss = p.memory_info().rss / 2**20
            role = "supervisor" if p is sup else "worker"
            verdict = "" if p is sup else ("met" if cpu <= GOAL_CPU else "**NOT met**")
            goal = "" if p is sup else f"<= {GOAL_CPU}"
            rows.append(f"| {kind} | {role} {p.pid} | {cpu:.3f} | {wakes:.1f} | {rss:.1f} | "
                        f"{load:.1f} | {goal} | {verdict} |")  # fmt: skip
    return rows


def memory(url: str) -> list[str]:
    subprocess.run(_supervisor("migrate", "--db", url), env=_env(), check=True,
                   capture_output=True)  # fmt: skip
    with pool(url, 8, "benchapp_idle:app") as sup:
        workers = _workers(sup, 8)
        time.sleep(3.0)  # (every worker booted and idle)
        s = sup.memory_full_info()
        w = max((p.memory_full_info() for p in workers), key=lambda m: m.rss)
    return [
        f"| supervisor, -n 8 | {s.rss / 2**20:.1f} | {s.uss / 2**20:.1f} | "
        f"<= {GOAL_SUPERVISOR_RSS:.0f} | {'met' if s.rss / 2**20 <= GOAL_SUPERVISOR_RSS else '**NOT met**'} |",  # noqa: E501
        f"| largest worker, one slot | {w.rss / 2**20:.1f} | {w.uss / 2**20:.1f} | "
        f"<= {GOAL_WORKER_RSS:.0f} | {'met' if w.rss / 2**20 <= GOAL_WORKER_RSS else '**NOT met**'} |",  # noqa: E501
    ]


def run(args: argparse.Namespace) -> int:
    bench_args.fill_sizes(args, [("window", 60.0, 5.0)])
    if not 1 <= args.window <= 3600:
        args.parser.error("--window must be 1 to 3600 seconds")
    with tempfile.TemporaryDirectory(prefix="lk-bench-idle-", dir=args.dir) as tmp, \
            receiver() as hook_url:  # fmt: skip
        rows = idle_cpu("SQLite", os.path.join(tmp, "idle.db"), hook_url, args.window)
        if args.postgres:
            import bench_pg  # noqa: PLC0415 - psycopg, only for PostgreSQL

            with bench_pg.bench_database(args.postgres) as url:
                rows += idle_cpu("PostgreSQL", url, hook_url, args.window)
        print(f"\nIdle pool, -n 2, a schedule and a parked webhook: CPU over {args.window:g} s")
        print("\n| backend | process | CPU % of a core | wake-ups/s | RSS MB | load | goal | |")
        print("|---|---|---:|---:|---:|---:|---|---|")
        print("\n".join(rows))
        print("\nMemory, SQLite, plain handlers, one slot")
        print("\n| process | RSS MB | USS MB | goal MB | |")
        print("|---|---:|---:|---:|---|")
        print("\n".join(memory(os.path.join(tmp, "memory.db"))))
    return 0
