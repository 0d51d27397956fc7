"""Webhook delivery's figures (B20; a row of scripts/bench): a pool of
``supervisor start -n 2`` delivering to a local receiver (a real HTTP server answering 204), on
SQLite and PostgreSQL:

(a) backlog: M no-op runs enqueued with a webhook on ``run.succeeded``; the seconds until every
    run succeeded and until every success was delivered, and deliveries per second;
(b) trickle: one run every 50 ms into an idle pool: from each ``run.succeeded`` event's commit
    to its receipt (p50 / p99): the parked delivery woken by the waker, claimed and POSTed;
(c) catch-up: M runs succeeded first, then a webhook added over them (``--after 0``): the
    deliveries per second with nothing else running (up to 8 POSTs in flight; each round of
    answers moves the position: one small fenced commit).

    scripts/bench webhooks [--quick] [--runs 2000] [--trickle 60]
        [--postgres URL|'']
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import bench_args
import bench_pg
from bench_procs import ENV, PY

from workerproc.store import open_store


class Receiver:
    def __init__(self) -> None:
        self.got: list[tuple[float, dict[str, Any]]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a production receiver would

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    receiver.got.append((time.time(), json.loads(body)))
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def count(self) -> int:
        with self.lock:
            return len({e["id"] for _, e in self.got})


def pool(db: str) -> subprocess.Popen[bytes]:
    cmd = [PY, "-m", "supervisor", "start", "-n", "2", "--concurrency", "4", "--db", db,
           "--app", "benchapp:app", "--poll-interval", "0.2", "--log-level", "warning"]  # fmt: skip
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait(predicate: Any, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.005)
    return time.monotonic()


def one(db: str, runs: int, trickle: int) -> dict[str, float]:
    receiver = Receiver()
    with open_store(db) as store:
        store.add_webhook("bench", receiver.url, secret="bench", kinds=["run.succeeded"])
        store.start_runs([{"task": "noop"}] * runs)
    started = time.monotonic()
    proc = pool(db)
    try:
        with open_store(db) as store:
            done = wait(lambda: store.stats().runs.get("succeeded", 0) >= runs, 600)
        delivered = wait(lambda: receiver.count() >= runs, 600)
        base = receiver.count()
        with open_store(db) as store:
            for _ in range(trickle):
                store.start_run("noop")
                time.sleep(0.05)
        wait(lambda: receiver.count() >= base + trickle, 120)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        receiver.server.shutdown()
    lags = sorted((at - e["at"]) * 1000 for at, e in receiver.got[base:])
    return {
        "drain_s": done - started, "delivered_s": delivered - started,
        "deliveries_per_s": runs / (delivered - started),
        "lag_p50_ms": statistics.median(lags),
        "lag_p99_ms": lags[min(len(lags) - 1, int(0.99 * len(lags)))],
    }  # fmt: skip


def catch_up(db: str, runs: int) -> float:
    """Deliveries per second of a webhook added over ``runs`` succeeded runs."""
    with open_store(db) as store:
        store.start_runs([{"task": "noop"}] * runs)
    proc = pool(db)
    receiver = Receiver()
    try:
        with open_store(db) as store:
            wait(lambda: store.stats().runs.get("succeeded", 0) >= runs, 600)
            store.add_webhook("behind", receiver.url, secret="b", kinds=["run.succeeded"],
                              after=0)  # fmt: skip
        began = time.monotonic()
        done = wait(lambda: receiver.count() >= runs, 600)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        receiver.server.shutdown()
    return runs / (done - began)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of ``scripts/bench webhooks``."""
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--trickle", type=int, default=60)
    bench_args.add_quick(ap)
    bench_args.add_postgres(ap)


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.runs, args.trickle = min(args.runs, 100), min(args.trickle, 5)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        row = one(os.path.join(tmp, "lk.db"), args.runs, args.trickle)
        row["catch_up_per_s"] = catch_up(os.path.join(tmp, "behind.db"), args.runs)
        rows.append(("SQLite", row))
    if args.postgres:
        with bench_pg.bench_database(args.postgres) as url:
            row = one(url, args.runs, args.trickle)
        with bench_pg.bench_database(args.postgres) as url:
            row["catch_up_per_s"] = catch_up(url, args.runs)
        rows.append(("PostgreSQL", row))
    print(
        f"webhook delivery, supervisor start -n 2 --concurrency 4, {args.runs:,} no-op runs "
        f"with a webhook on run.succeeded, then {args.trickle} runs, one every 50 ms\n"
    )
    print(
        "| backend | all runs succeeded (s) | all delivered (s) | deliveries/s "
        "| commit to receipt, p50 / p99 (ms) | catch-up, deliveries/s |"
    )
    print("| --- | ---: | ---: | ---: | --- | ---: |")
    for name, r in rows:
        print(
            f"| {name} | {r['drain_s']:.2f} | {r['delivered_s']:.2f} "
            f"| {r['deliveries_per_s']:,.0f} | {r['lag_p50_ms']:.1f} / {r['lag_p99_ms']:.1f} "
            f"| {r['catch_up_per_s']:,.0f} |"
        )
    sys.stdout.flush()
    return 0
