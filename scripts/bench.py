"""leasekeeper vs huey on the same machine, in one run, interleaved (see scripts/bench).

Throughput: M no-op runs drained by `supervisor start -n W --drain` vs M no-op huey tasks with
`huey_consumer -k process -w W`, both at synchronous FULL (plus a NORMAL row for ours), timed from
process start until every one is done (ours: counted in the database; huey: one datagram per
task), beside the raw fused one-transaction loop (complete the previous task + claim the next in
one transaction) as the ceiling. Medians of --rounds rounds; the order alternates per round.
Then idle pickup, takeover after SIGKILL, write-lock wait, and peak RSS. Then the PostgreSQL
rows (scripts/bench_pg.py): ours from one and from two supervisors beside procrastinate on the
same server, idle pickup, takeover, and the claim beside a million finished runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import bench_pg
import psutil
from bench_store import bulk_runs, hammer, new_db, pct

from workerproc.store import open_store

HERE = Path(__file__).resolve().parent
PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}


class Inbox:
    """A Unix datagram socket the huey tasks report to."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind(path)
        self.count = 0
        self.messages: list[tuple[float, bytes]] = []
        self.keep = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            data = self.sock.recv(256)
            self.count += 1
            if self.keep:
                self.messages.append((time.time(), data))

    def wait(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.count < count and time.monotonic() < deadline:
            time.sleep(0.002)
        return self.count >= count


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- throughput ------------------------------------------------------------------------------------
def ours(tmp: str, m: int, w: int, sync: str, rss: dict[str, float] | None = None) -> float:
    db = new_db(tmp, f"ours-{w}-{sync}-{time.monotonic_ns()}")
    bulk_runs(db, m, time.time() - 1)
    url = f"sqlite:///{db}?synchronous={sync}"
    cmd = [PY, "-m", "supervisor", "start", "-n", str(w), "--db", url, "--app", "benchapp:app",
           "--drain"]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=HERE, env=ENV, stderr=subprocess.DEVNULL)
    while proc.poll() is None:
        if rss is not None:
            sample_rss(proc.pid, rss)
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    store = open_store(db)
    done = store.stats().runs.get("succeeded", 0)
    store.close()
    if proc.returncode != 0 or done != m:
        raise SystemExit(f"ours -n {w}: exit {proc.returncode}, {done} of {m} runs succeeded")
    return m / elapsed


def sample_rss(pid: int, peak: dict[str, float]) -> None:
    try:
        parent = psutil.Process(pid)
        peak["supervisor"] = max(peak.get("supervisor", 0), parent.memory_info().rss / 2**20)
        for child in parent.children():
            peak["worker"] = max(peak.get("worker", 0), child.memory_info().rss / 2**20)
    except psutil.Error:
        pass


def huey_env(tmp: str, tag: str) -> tuple[dict[str, str], Inbox]:
    db = os.path.join(tmp, f"huey-{tag}-{time.monotonic_ns()}.db")
    inbox = Inbox(os.path.join(tmp, f"huey-{time.monotonic_ns()}.sock"))
    return {**ENV, "LK_HUEY_DB": db, "LK_HUEY_SOCK": inbox.path}, inbox


def huey_enqueue(env: dict[str, str], task: str, n: int, *args: float) -> None:
    code = (
        "import sys; import bench_huey as b\n"
        "b.huey.storage.conn.execute('pragma synchronous=0')  # a fast set-up only\n"
        f"t = getattr(b, {task!r})\n"
        f"for _ in range({n}): t(*{list(args)!r})\n"
    )
    subprocess.run([PY, "-c", code], cwd=HERE, env=env, check=True)


def huey_consumer(env: dict[str, str], w: int) -> subprocess.Popen[bytes]:
    cmd = [str(Path(PY).with_name("huey_consumer")), "bench_huey.huey", "-k", "process",
           "-w", str(w), "-n", "-C"]  # fmt: skip
    return subprocess.Popen(cmd, cwd=HERE, env=env, stderr=subprocess.DEVNULL)


def huey(tmp: str, m: int, w: int) -> float:
    env, inbox = huey_env(tmp, f"tp{w}")
    huey_enqueue(env, "noop", m)
    started = time.monotonic()
    proc = huey_consumer(env, w)
    finished = inbox.wait(m, timeout=600)
    elapsed = time.monotonic() - started
    stop(proc)
    if not finished:
        raise SystemExit(f"huey -w {w}: only {inbox.count} of {m} tasks reported done")
    return m / elapsed


def _raw_worker(args: tuple[str, str, int]) -> int:
    db, sync, me = args
    c = sqlite3.connect(db, isolation_level=None, timeout=30)
    c.execute(f"PRAGMA synchronous={sync}")
    prev, n = None, 0
    while True:
        c.execute("BEGIN IMMEDIATE")
        if prev is not None:
            c.execute("UPDATE q SET done = 1, owner = NULL WHERE id = ? AND owner = ?", (prev, me))
        row = c.execute(
            "UPDATE q SET owner = ?, expires = ?, attempts = attempts + 1 WHERE id = "
            "(SELECT id FROM q WHERE done = 0 AND owner IS NULL ORDER BY id LIMIT 1) RETURNING id",
            (me, time.time() + 60),
        ).fetchone()
        c.execute("COMMIT")
        if row is None:
            return n
        prev, n = row[0], n + 1


def raw(tmp: str, m: int, w: int, sync: str = "FULL") -> float:
    """The ceiling: a bare fused loop, one write transaction per task, no framework around it."""
    db = os.path.join(tmp, f"raw-{w}-{time.monotonic_ns()}.db")
    c = sqlite3.connect(db, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("CREATE TABLE q (id INTEGER PRIMARY KEY, owner INTEGER, expires REAL,"
              " done INTEGER NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0)")  # fmt: skip
    c.execute("CREATE INDEX q_ready ON q (done, id)")
    c.execute("BEGIN")
    c.executemany("INSERT INTO q (id) VALUES (?)", ((i,) for i in range(1, m + 1)))
    c.execute("COMMIT")
    c.close()
    started = time.monotonic()
    with get_context("fork").Pool(w) as pool:
        done = sum(pool.map(_raw_worker, [(db, sync, i) for i in range(w)]))
    elapsed = time.monotonic() - started
    assert done == m, (done, m)
    return m / elapsed


# -- latency -----------------------------------------------------------------------------------
def gaps(n: int) -> list[float]:
    import random  # noqa: PLC0415 - only here

    rng = random.Random(7)
    return [rng.uniform(0.2, 2.0) for _ in range(n)]


def ours_pickup(tmp: str, samples: int) -> list[float]:
    db = new_db(tmp, "pickup")
    cmd = [PY, "-m", "supervisor", "start", "-n", "8", "--db", db, "--app", "benchapp:app"]
    proc = subprocess.Popen(cmd, cwd=HERE, env=ENV, stderr=subprocess.DEVNULL)
    store = open_store(db)
    out = []
    try:
        time.sleep(3)  # up, then idle
        for gap in gaps(samples):
            time.sleep(gap)
            t0 = time.time()
            run_id = store.start_run("stamp")
            while (run := store.get_run(run_id)) is None or run.status != "succeeded":
                time.sleep(0.0005)
            out.append((float(run.result) - t0) * 1000)
    finally:
        stop(proc)
        store.close()
    return out


def huey_pickup(env: dict[str, str], inbox: Inbox, samples: int, idle: float) -> list[float]:
    proc = huey_consumer(env, 8)
    out = []
    try:
        time.sleep(idle)  # "after it has been idle a minute": its polling delay has grown
        inbox.keep = True
        for gap in gaps(samples):
            time.sleep(gap)
            before = len(inbox.messages)
            t0 = time.time()
            huey_enqueue(env, "stamp", 1)
            deadline = time.monotonic() + 30
            while len(inbox.messages) == before and time.monotonic() < deadline:
                time.sleep(0.0005)
            out.append((float(inbox.messages[-1][1]) - t0) * 1000)
    finally:
        stop(proc)
    return out


def huey_kill(env: dict[str, str], inbox: Inbox) -> tuple[int, int]:
    """SIGKILL the huey worker running a task: is the task ever run again?"""
    proc = huey_consumer(env, 2)
    lost = trials = 0
    try:
        inbox.keep = True
        for _ in range(2):
            trials += 1
            before = len(inbox.messages)
            huey_enqueue(env, "hold", 1, 3.0)
            deadline = time.monotonic() + 30
            while len(inbox.messages) == before and time.monotonic() < deadline:
                time.sleep(0.001)
            pid = int(inbox.messages[-1][1].split()[1])
            os.kill(pid, signal.SIGKILL)
            time.sleep(6.0)  # twice the task's length: a re-run would have started and ended
            rerun = [m for _, m in inbox.messages[before + 1 :] if m.startswith(b"start")]
            lost += not rerun
    finally:
        stop(proc)
    return lost, trials


def takeover(fast: bool, trials: int) -> list[float]:
    from measure_fast_release import measure  # noqa: PLC0415 - its own script, reused

    return measure(trials, 30.0 if fast else 2.0, fast, False)  # milliseconds


def round_sides(
    tmp: str, m: int, w: int, rss: dict[str, float] | None
) -> list[tuple[str, Callable[[], float]]]:
    """One round's measurements at width ``w`` (the widest also runs ours at NORMAL)."""
    return [
        (f"ours -n {w}", lambda: ours(tmp, m, w, "full", rss)),
        (f"huey -w {w}", lambda: huey(tmp, m, w)),
        (f"raw fused {w}", lambda: raw(tmp, m, w)),
        (f"ours -n {w} NORMAL", lambda: ours(tmp, m, w, "normal")),
    ]


# -- the table ---------------------------------------------------------------------------------
def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", default="1,2,8")
    ap.add_argument("--samples", type=int, default=30, help="idle pickup samples")
    ap.add_argument("--idle", type=float, default=60.0, help="huey's idle time before pickup")
    ap.add_argument("--quick", action="store_true", help="a fast smoke run (not for figures)")
    ap.add_argument(
        "--postgres",
        default=os.environ.get("LEASEKEEPER_BENCH_POSTGRES", bench_pg.DEFAULT_SERVER),
        help="a PostgreSQL server URL for the PostgreSQL rows ('' to skip them)",
    )
    ap.add_argument("--only-postgres", action="store_true", help="skip the SQLite rows")
    args = ap.parse_args()
    if args.quick:
        args.tasks, args.rounds, args.samples, args.idle = 1500, 1, 5, 3.0
    widths = [int(w) for w in args.workers.split(",")]
    if args.only_postgres:
        return postgres_rows(args, widths)
    tmp = tempfile.mkdtemp(prefix="lk-bench-")
    results: dict[str, list[float]] = {}
    rss: dict[str, float] = {}
    started = time.monotonic()

    def run(key: str, fn: Callable[[], float]) -> None:
        value = fn()
        results.setdefault(key, []).append(value)
        print(f"  round {r + 1}: {key:<22} {value:8.0f} /s", file=sys.stderr, flush=True)

    for r in range(args.rounds):
        for w in widths:
            sides = round_sides(tmp, args.tasks, w, rss if w == max(widths) else None)
            if w != max(widths):
                sides = sides[:3]
            for key, fn in sides if r % 2 == 0 else reversed(sides):
                run(key, fn)

    print("  idle pickup, takeover, lock wait ...", file=sys.stderr, flush=True)
    henv, hinbox = huey_env(tmp, "idle")
    ours_lat = ours_pickup(tmp, args.samples)
    huey_lat = huey_pickup(henv, hinbox, args.samples, args.idle)
    fast = takeover(True, 3 if args.quick else 10)
    slow = takeover(False, 2 if args.quick else 3)
    kenv, kinbox = huey_env(tmp, "kill")
    lost, trials = huey_kill(kenv, kinbox)
    lock_path = new_db(tmp, "lock")
    bulk_runs(lock_path, 200_000 if not args.quick else 20_000, time.time() - 60)
    lock = hammer(f"sqlite:///{lock_path}", 8, 3.0 if args.quick else 8.0, lock_probe=True)
    waits = [x for res in lock for x in res[3]]
    worst = max(pct(res[3], 0.99) for res in lock)

    print_table(args, widths, results, rss, ours_lat, huey_lat, fast, slow, (lost, trials),
                waits, worst, time.monotonic() - started)  # fmt: skip
    return postgres_rows(args, widths) if args.postgres else 0


def postgres_rows(args: Any, widths: list[int]) -> int:
    if not args.postgres:
        raise SystemExit("--only-postgres needs --postgres URL")
    try:
        database = bench_pg.bench_database(args.postgres)
        url = database.__enter__()
    except Exception as exc:
        print(f"\nno PostgreSQL rows: cannot use {args.postgres}: {exc}", file=sys.stderr)
        return 1
    try:
        for line in bench_pg.rows(url, args, widths, gaps(args.samples)):
            print(line)
    finally:
        database.__exit__(None, None, None)
    return 0


def print_table(args: Any, widths: list[int], results: dict[str, list[float]],
                rss: dict[str, float], ours_lat: list[float], huey_lat: list[float],
                fast: list[float], slow: list[float], huey_lost: tuple[int, int],
                waits: list[float], worst: float, elapsed: float) -> None:  # fmt: skip
    cpu = platform.processor() or platform.machine()
    print(f"\nmachine: {os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, "
          f"SQLite {sqlite3.sqlite_version}, huey {huey_version()}; {args.tasks:,} no-op tasks, "
          f"median of {args.rounds} rounds; {elapsed:.0f} s in all\n")  # fmt: skip
    print("| throughput (tasks/s) | W | ours | huey | raw fused ceiling | ours / huey "
          "| ours / ceiling |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for w in widths:
        o, h, c = (median(results[f"{k} {w}"]) for k in ("ours -n", "huey -w", "raw fused"))
        print(f"| FULL | {w} | {o:,.0f} | {h:,.0f} | {c:,.0f} | {o / h:.2f}x | {o / c:.0%} |")
    top = max(widths)
    if f"ours -n {top} NORMAL" in results:
        o = median(results[f"ours -n {top} NORMAL"])
        h, c = median(results[f"huey -w {top}"]), median(results[f"raw fused {top}"])
        print(f"| ours NORMAL vs FULL | {top} | {o:,.0f} | {h:,.0f} | {c:,.0f} | {o / h:.2f}x "
              f"| {o / c:.0%} |")  # fmt: skip
    print("\n| measure | ours | huey | goal |")
    print("| --- | --- | --- | --- |")
    print(f"| idle pickup p50 / p99 (ms), {args.samples} samples | "
          f"{median(ours_lat):.1f} / {pct(ours_lat, 0.99):.1f} | "
          f"{median(huey_lat):.0f} / {pct(huey_lat, 0.99):.0f} (idle {args.idle:g} s first) "
          "| p50 <= 20, p99 <= 100 |")  # fmt: skip
    print(f"| takeover after SIGKILL, fast release p50 / p99 (ms) | {median(fast):.1f} / "
          f"{pct(fast, 0.99):.1f} | task lost in {huey_lost[0]} of {huey_lost[1]} kills "
          "| p99 <= 200 |")  # fmt: skip
    print(f"| takeover after SIGKILL, ttl path (ttl 2 s) p50 (ms) | {median(slow):.0f} | "
          "- | ~ ttl |")  # fmt: skip
    print(f"| write-lock wait, 8 busy processes: p99 all / worst process (ms) | "
          f"{pct(waits, 0.99) * 1000:.1f} / {worst * 1000:.1f} | - | p99 <= 50 |")  # fmt: skip
    print(f"| peak RSS, supervisor / one worker (MB), -n 8 | {rss.get('supervisor', 0):.1f} / "
          f"{rss.get('worker', 0):.1f} | - | <= 30 / <= 25 |")  # fmt: skip


def huey_version() -> str:
    import huey as h  # noqa: PLC0415 - the bench extra

    return str(h.__version__)


if __name__ == "__main__":
    sys.exit(main())
