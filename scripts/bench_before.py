"""No-op throughput, idle pickup and takeover: this checkout against an earlier commit, on this
machine, now.

"No worse than today" needs the figures of the code before slots measured on the same
machine in the same minutes: idle latency here depends on how fast an idle machine wakes up (a
``SELECT 1`` after 0.3 s of idle can take 50x its warm time), so figures from another day or
machine compare nothing. This script checks ``REV`` out into a temporary worktree, drains the
same no-op runs with each tree's pool (``-n 8``, then ``-n 2 --concurrency 16``; each tree
makes its own database, so each has its own schema), alternating who goes first, starts both
pools at once (``supervisor start -n 8``, one database each) and alternates idle pickup samples
between them, then measures takeover after SIGKILL with each tree's own
``scripts/measure_fast_release.py``, alternating rounds.

    scripts/bench before 524312a [--samples 120] [--trials 12]
    scripts/bench before 26f0342 --backend both [--server URL]
    scripts/bench before 26f0342 --now 4062d17   # a commit, not this tree

(about 9 minutes per backend; 524312a is the last commit before slots). ``--backend postgres``
measures throughput and idle pickup on PostgreSQL the same way: each tree gets a fresh database
of its own on ``--server`` (created for the run, dropped after it; one schema per measurement
inside it), its runs enqueued through its own ``start_runs`` (each tree writes its own schema's
rows), and its pools started with ``--db postgresql://...?schema=...`` as scripts/bench_pg.py
does. Takeover is measured on SQLite only (the earlier trees' measure_fast_release.py speaks
SQLite).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import secrets
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import bench_args
from bench_procs import drain, stop, tree_env

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "524312a"  # the last commit before slots
BACKENDS = ("sqlite", "postgres")
SERVER = bench_args.SERVER
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

    def __init__(self, tree: Path, url: str, look: Callable[[int], tuple[str, Any] | None]) -> None:
        self.look = look  # run id -> (status, result) or None, read from that database
        self.url = url
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(tree / "scripts")]))
        cmd = [sys.executable, "-m", "supervisor", "start", "-n", "8", "--db", url,
               "--app", "benchapp:app"]  # fmt: skip
        self.proc = subprocess.Popen(cmd, cwd=tree / "scripts", env=env, stderr=subprocess.DEVNULL)
        # cwd: ``python -c`` puts it first on sys.path, ahead of PYTHONPATH
        self.producer = subprocess.Popen([sys.executable, "-c", ENQUEUE, url], cwd=tree,
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
            row = self.look(int(run_id))
            if row is not None and row[0] == "succeeded":
                result = json.loads(row[1]) if isinstance(row[1], str) else row[1]
                return (float(result) - float(t0)) * 1000
            time.sleep(0.001)
        raise SystemExit(f"{self.url}: run {run_id} did not finish within 60 s")

    def stop(self) -> None:
        if self.producer.stdin is not None:
            self.producer.stdin.close()
        self.producer.wait(30)
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def sqlite_pool(tree: Path, work: Path, name: str) -> Pool:
    db = str(work / f"{name}.db")

    def look(run_id: int) -> tuple[str, Any] | None:
        with sqlite3.connect(db, timeout=5) as conn:
            row = conn.execute("SELECT status, result FROM runs WHERE id = ?",
                               (run_id,)).fetchone()  # fmt: skip
        return None if row is None else (row[0], row[1])

    return Pool(tree, db, look)


def pg_pool(tree: Path, database: str, name: str) -> Pool:
    url = schema_url(database, f"pickup_{name}")
    subprocess.run([sys.executable, "-c", OPEN_STORE, url], cwd=tree / "scripts",
                   env=tree_env(tree), check=True)  # fmt: skip  # its own schema, made first
    conn = pg_connect(url)

    def look(run_id: int) -> tuple[str, Any] | None:
        row = conn.execute("SELECT status, result FROM runs WHERE id = %s", (run_id,)).fetchone()
        return None if row is None else (row[0], row[1])

    return Pool(tree, url, look)


def pickup(trees: dict[str, Path], samples: int, open_pool: PoolOpener) -> dict[str, list[float]]:
    pools = {name: open_pool(tree, name) for name, tree in trees.items()}
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


PoolOpener = Callable[[Path, str], Pool]
SHAPES = (("-n", "8"), ("-n", "2", "--concurrency", "16"))
OPEN_STORE = """import sys
from workerproc.store import open_store
open_store(sys.argv[1]).close()"""
MAKE_PG = """import sys
from workerproc.store import open_store
store, left = open_store(sys.argv[1]), int(sys.argv[2])
while left:
    k = min(left, 2000)
    store.start_runs([{"task": "bench"}] * k)
    left -= k
store.close()"""
MAKE_DB = """import sys, time
from bench_store import bulk_runs
from workerproc.store import open_store
open_store(sys.argv[1]).close()
bulk_runs(sys.argv[1], int(sys.argv[2]), time.time() - 1)"""


def throughput(
    trees: dict[str, Path], m: int, rounds: int, drain_one: Drainer
) -> dict[str, dict[str, list[float]]]:
    """No-op runs/s per shape and tree: ``m`` runs drained, ``rounds`` times, order alternating."""
    out: dict[str, dict[str, list[float]]] = {}
    shapes = [s for s in SHAPES if all(supports(tree, s) for tree in trees.values())]
    for r in range(rounds):
        for shape in shapes:
            per = out.setdefault(" ".join(shape), {name: [] for name in trees})
            for name in list(trees)[:: 1 if r % 2 else -1]:
                tag = f"{name}-{r}-{len(per[name])}-{shape[1]}"
                seconds = drain_one(trees[name], name, tag, m, shape)
                per[name].append(m / seconds)
    return out


# (tree, its name, a tag for this drain, runs, shape) -> seconds until the last run finished
Drainer = Callable[[Path, str, str, int, tuple[str, ...]], float]


def sqlite_drainer(work: Path) -> Drainer:
    def drain_one(tree: Path, name: str, tag: str, m: int, shape: tuple[str, ...]) -> float:
        db = str(work / f"tp-{tag}.db")
        # each tree's own store and bulk insert: each has its own schema
        subprocess.run([sys.executable, "-c", MAKE_DB, db, str(m)], cwd=tree / "scripts",
                       env=tree_env(tree), check=True)  # fmt: skip
        return drain(db, m, f"sqlite:///{db}", shape, tree=tree)

    return drain_one


def pg_drainer(databases: dict[str, str]) -> Drainer:
    def drain_one(tree: Path, name: str, tag: str, m: int, shape: tuple[str, ...]) -> float:
        url = schema_url(databases[name], "tp_" + re.sub(r"\W", "_", tag))
        # each tree's own store and its own start_runs: each writes its own schema's rows
        subprocess.run([sys.executable, "-c", MAKE_PG, url, str(m)], cwd=tree / "scripts",
                       env=tree_env(tree), check=True)  # fmt: skip
        cmd = [sys.executable, "-m", "supervisor", "start", *shape, "--db", url,
               "--app", "benchapp:app", "--drain"]  # fmt: skip
        started = time.time()
        proc = subprocess.Popen(cmd, cwd=tree / "scripts", env=tree_env(tree),
                                stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            code = proc.wait(900)
        except subprocess.TimeoutExpired:
            stop(proc)
            shown = " ".join(shape)
            raise SystemExit(f"{name} {shown} on PostgreSQL: draining after 900 s") from None
        with pg_connect(url) as conn:
            done, last = conn.execute("SELECT count(*), max(finished_at) FROM runs "
                                      "WHERE status = 'succeeded'").fetchone()  # fmt: skip
        if code != 0 or done != m:
            raise SystemExit(f"{name} {' '.join(shape)} on PostgreSQL: exit {code}, "
                             f"{done} of {m} runs succeeded")  # fmt: skip
        return float(last) - started  # the database's clock: the same host's

    return drain_one


def schema_url(database: str, tag: str) -> str:
    return f"{database}?schema={tag}_{secrets.token_hex(3)}".lower()


def pg_connect(url: str) -> Any:
    """An autocommit connection to ``url``'s database with its ``?schema=`` as search path."""
    import psycopg  # noqa: PLC0415 - the postgres extra; SQLite-only runs do without it

    base, _, schema = url.partition("?schema=")
    conn = psycopg.connect(base, autocommit=True, connect_timeout=5)
    if schema:
        conn.execute(f'SET search_path = "{schema}"')
    return conn


@contextmanager
def pg_databases(server: str, names: list[str]) -> Iterator[dict[str, str]]:
    """A fresh database per tree on ``server`` (a URL naming a database we may connect to),
    dropped after the run: the trees' schemas and their load never meet."""
    tag = f"lk_before_{os.getpid()}_{secrets.token_hex(3)}"
    made: dict[str, str] = {}
    try:
        with pg_connect(server) as conn:
            for name in names:
                conn.execute(f'CREATE DATABASE "{tag}_{name}"')
                made[name] = urlunsplit(urlsplit(server)._replace(path=f"/{tag}_{name}",
                                                                  query=""))  # fmt: skip
        yield made
    finally:
        with pg_connect(server) as conn:
            for name in made:
                conn.execute(f'DROP DATABASE IF EXISTS "{tag}_{name}" WITH (FORCE)')


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
    """SQLite's figures against ``rev`` (scripts/bench's --before)."""
    return measure_backends(rev, samples, trials, rounds, tasks, ("sqlite",))["sqlite"]


def measure_backends(
    rev: str,
    samples: int,
    trials: int,
    rounds: int,
    tasks: int = 20_000,
    backends: tuple[str, ...] = ("sqlite",),
    server: str = SERVER,
    now: str | None = None,
) -> dict[str, Before]:
    """``now``: a commit to measure in place of this checkout (an issue's own merge, say, to
    tell its cost from what came after it)."""
    out: dict[str, Before] = {}
    with tempfile.TemporaryDirectory(prefix="lk-before-") as tmp:
        work = Path(tmp)
        checked = {"before": rev} if now is None else {"before": rev, "now": now}
        for name, commit in checked.items():
            subprocess.run(["git", "worktree", "add", "--detach", "-q", str(work / name),
                            commit], cwd=ROOT, check=True)  # fmt: skip
        try:
            trees = {"before": work / "before", "now": ROOT if now is None else work / "now"}
            for backend in backends:
                if backend == "sqlite":
                    out[backend] = measure_sqlite(rev, trees, work, samples, trials, rounds, tasks)
                else:
                    with pg_databases(server, list(trees)) as databases:
                        out[backend] = measure_pg(rev, trees, databases, samples, rounds, tasks)
        finally:
            removed = all([subprocess.run(["git", "worktree", "remove", "--force",
                                           str(work / name)], cwd=ROOT,
                                          check=False).returncode == 0
                           for name in checked])  # fmt: skip
    if not removed:  # another git command held the repository's lock: forget the stale entry
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, check=False)
    return out


def say(text: str) -> None:
    print(f"  {text} ...", file=sys.stderr, flush=True)


def measure_sqlite(
    rev: str, trees: dict[str, Path], work: Path, samples: int, trials: int, rounds: int,
    tasks: int,
) -> Before:  # fmt: skip
    say(f"SQLite no-op throughput against {rev}: {tasks:,} runs, {rounds + 1} rounds")
    runs = throughput(trees, tasks, rounds + 1, sqlite_drainer(work))
    say(f"SQLite idle pickup against {rev}: {samples} samples each, alternating")
    lat = pickup(trees, samples, lambda tree, name: sqlite_pool(tree, work, name))
    say(f"SQLite takeover against {rev}: {rounds} x {trials} trials each")
    took = takeover(trees, trials, rounds)
    return {"pickup": lat, "takeover": took, **{f"runs/s {k}": v for k, v in runs.items()}}


def measure_pg(
    rev: str, trees: dict[str, Path], databases: dict[str, str], samples: int, rounds: int,
    tasks: int,
) -> Before:  # fmt: skip
    say(f"PostgreSQL no-op throughput against {rev}: {tasks:,} runs, {rounds + 1} rounds")
    runs = throughput(trees, tasks, rounds + 1, pg_drainer(databases))
    say(f"PostgreSQL idle pickup against {rev}: {samples} samples each, alternating")
    lat = pickup(trees, samples, lambda tree, name: pg_pool(tree, databases[name], name))
    return {"pickup": lat, **{f"runs/s {k}": v for k, v in runs.items()}}


def table(rev: str, data: Before, backend: str = "sqlite", now: str | None = None) -> list[str]:
    def short(commit: str) -> str:
        return subprocess.run(["git", "rev-parse", "--short", commit], cwd=ROOT,
                              capture_output=True, text=True).stdout.strip()  # fmt: skip

    was, new = f"before ({short(rev)})", "now" if now is None else f"now ({short(now)})"
    on = "" if backend == "sqlite" else f"{backend}: "
    lines = [f"| {on}p50 / p99 (ms), same machine, same run | {was} | {new} "
             "| now / before |", "| --- | ---: | ---: | ---: |"]  # fmt: skip
    for label, key in (("idle pickup, -n 8", "pickup"),
                       ("takeover after SIGKILL, fast release", "takeover")):  # fmt: skip
        if key not in data:
            continue
        b, n = data[key]["before"], data[key]["now"]
        row = [f"{statistics.median(v):.1f} / {pct(v, 0.99):.1f}" for v in (b, n)]
        ratio = (f"{statistics.median(n) / statistics.median(b):.2f}x / "
                 f"{pct(n, 0.99) / pct(b, 0.99):.2f}x")  # fmt: skip
        lines.append(f"| {label} | {row[0]} | {row[1]} | {ratio} |")
    lines += ["", f"| {on}no-op runs/s, median, same machine, same run | {was} | {new} "
              "| now / before |", "| --- | ---: | ---: | ---: |"]  # fmt: skip
    for key in (k for k in data if k.startswith("runs/s ")):
        mb, mn = statistics.median(data[key]["before"]), statistics.median(data[key]["now"])
        lines.append(f"| {key.removeprefix('runs/s ')} | {mb:,.0f} | {mn:,.0f} | {mn / mb:.2f}x |")
    return lines


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of ``scripts/bench before``."""
    ap.add_argument("rev", help="the earlier commit (524312a: the last one before slots)")
    ap.add_argument("--samples", type=int, default=120, help="idle pickup samples per tree")
    ap.add_argument("--trials", type=int, default=12, help="takeover trials per round")
    ap.add_argument("--rounds", type=int, default=2, help="takeover rounds per tree")
    ap.add_argument("--tasks", type=int, default=20_000, help="no-op runs per drain")
    ap.add_argument("--backend", choices=(*BACKENDS, "both"), default="sqlite",
                    help="the backend(s) measured (default sqlite)")  # fmt: skip
    ap.add_argument(
        "--now",
        metavar="REV",
        help="measure this commit in place of the checkout (e.g. an issue's merge)",
    )
    ap.add_argument("--server", default=SERVER,
                    help=f"PostgreSQL: a URL of a database to connect to ({SERVER})")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    for rev in (args.rev, args.now):
        if rev is not None and not exists(rev):
            raise SystemExit(f"bench_before: no commit {rev!r} in this clone")
    backends = BACKENDS if args.backend == "both" else (args.backend,)
    data = measure_backends(args.rev, args.samples, args.trials, args.rounds, args.tasks,
                            backends, args.server, args.now)  # fmt: skip
    for backend, figures in data.items():
        print()
        print("\n".join(table(args.rev, figures, backend, args.now)))
    return 0
