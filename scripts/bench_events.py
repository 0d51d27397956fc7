"""The outbox's cost: enqueue and drain throughput of this checkout (every
transition writes its event) against an earlier commit (no events), on this machine, now.

``REV`` is exported with ``git archive`` into a temporary directory (no worktree is made). Each
trial runs in a child process whose ``PYTHONPATH`` is one tree, on a database of its own, and
the trees alternate who goes first, so a busy minute of the machine hurts both alike. Per
backend and tree, the median of the trials of:

- enqueue: ``start_run`` one run per transaction, and ``start_runs`` in batches of 100;
- drain: ``P`` processes, each the worker's exchange (``commit_many``: finish every lease it
  holds and claim up to 8 more, one transaction) until no run is left; finished runs per second.

    scripts/bench events [--before REV] [--runs 2000] [--trials 3]
        [--backends sqlite,postgres] [--procs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
SERVER = os.environ.get("LEASEKEEPER_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
CHILD = r"""
import json, multiprocessing, sys, time
from workerproc.store import ClaimRequest, Commit, open_store

url, runs, procs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def drain(k, barrier, out):
    store = open_store(url)
    barrier.wait()
    request = ClaimRequest(f"bench-{k}", 60.0, 3, 8)
    held = []
    while True:
        out_ = store.commit_many([Commit(x, "finish", expected_revision=x.revision)
                                  for x in held], claim=request)
        held = list(out_.leases)
        if not held:
            break
    out.put((time.perf_counter(), time.process_time()))
    store.close()

store = open_store(url)
t, c = time.perf_counter(), time.process_time()
for _ in range(runs // 2):
    store.start_run("noop")
single = (runs // 2) / (time.perf_counter() - t)
single_cpu = (time.process_time() - c) / (runs // 2) * 1e6
t, c = time.perf_counter(), time.process_time()
for _ in range(runs // 200):
    store.start_runs([{"task": "noop"}] * 100)
batch = (runs // 200 * 100) / (time.perf_counter() - t)
batch_cpu = (time.process_time() - c) / (runs // 200 * 100) * 1e6
total = runs // 2 + runs // 200 * 100
ctx = multiprocessing.get_context("fork")
barrier, out = ctx.Barrier(procs + 1), ctx.Queue()
workers = [ctx.Process(target=drain, args=(k, barrier, out)) for k in range(procs)]
for w in workers:
    w.start()
barrier.wait()
t = time.perf_counter()
ends = [out.get(timeout=600) for _ in workers]
for w in workers:
    w.join()
drained = total / (max(e[0] for e in ends) - t)
drain_cpu = sum(e[1] for e in ends) / total * 1e6
store.close()
print(json.dumps({"single": single, "batch": batch, "drain": drained, "single_cpu": single_cpu,
                  "batch_cpu": batch_cpu, "drain_cpu": drain_cpu}))
"""


def tree_of(rev: str, into: Path) -> Path:
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                         capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    return into


def database(backend: str, work: Path, tag: str) -> tuple[str, str | None]:
    if backend == "sqlite":
        return str(work / f"{tag}-{secrets.token_hex(3)}.db"), None
    schema = f"bench_ev_{tag}_{secrets.token_hex(3)}"
    return f"{SERVER}?schema={schema}", schema


def trial(tree: Path, url: str, runs: int, procs: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", CHILD, url, str(runs), str(procs)], env=env,
                          cwd=tree, capture_output=True, text=True, timeout=900)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``scripts/bench events``."""
    parser.add_argument("--before", default="577346b", help="the commit to compare against")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--backends", default="sqlite,postgres")


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="lk-bench-events-") as tmp:
        work = Path(tmp)
        before = tree_of(args.before, Path(tempfile.mkdtemp(dir=tmp, prefix="before-")))
        trees = {"before": before, "events": ROOT}
        for backend in args.backends.split(","):
            got: dict[str, list[dict[str, float]]] = {"before": [], "events": []}
            schemas = []
            for i in range(args.trials):
                order = ["before", "events"] if i % 2 == 0 else ["events", "before"]
                for name in order:
                    url, schema = database(backend, work, name)
                    schemas += [schema] if schema else []
                    got[name].append(trial(trees[name], url, args.runs, args.procs))
            if schemas:
                with psycopg.connect(SERVER, autocommit=True) as conn:
                    for schema in schemas:
                        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            print(f"\n{backend}: {args.runs} runs, {args.procs} draining processes, "
                  f"{args.trials} trials each, alternating")  # fmt: skip
            print(f"{'':22}{'runs/s: best of trials':>30}{'median':>24}"
                  f"{'client CPU us/run (median)':>34}")  # fmt: skip
            print(f"{'':22}" + f"{'before':>10}{'events':>10}{'change':>10}" * 3)
            for what, label in (("single", "enqueue, 1 per tx"), ("batch", "enqueue, 100 per tx"),
                                ("drain", "drain (exchange)")):  # fmt: skip
                cells = []
                for pick, key in ((max, what), (statistics.median, what),
                                  (statistics.median, what + "_cpu")):  # fmt: skip
                    b = pick(t[key] for t in got["before"])
                    e = pick(t[key] for t in got["events"])
                    cells.append(f"{b:10.0f}{e:10.0f}{(e / b - 1) * 100:+9.1f}%")
                print(f"{label:22}" + "".join(cells))
    return 0
