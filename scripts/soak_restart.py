"""A PostgreSQL server restart under load (``scripts/soak --restart``): a pool of workers and a
producer at ``--rate`` runs/s on a private server (tests/support/pg_private.py: its own data
directory and port, never the machine's shared server), which is stopped (``pg_ctl stop -m
fast``, as ``pg_ctlcluster ... stop``) for ``--outage`` seconds and started again.

Judged: the pool recovers (its first run finished after the server's return) within 2 s of it
accepting connections; nothing is lost (every run the producer handed over succeeded; the
producer retries a batch that failed with the same keys, as a real one would); nothing ran
twice on a live lease (the handlers' own ledger: no attempt starts after a later one began;
each run's one step written once); the workers log each incident once (``store_unavailable``,
then ``store_back``), not once per attempt: every worker process alive across the outage logs
exactly one of each, in that order (``told``). That holds when the outage outlasts the store's
reconnect (``busy_timeout``, 5 s): every worker then has a call fail (the exchange's in flight,
or an idle worker's check, its LISTEN connection dropped). A shorter one may be ridden out by a
reconnect with no call failing: then a worker logs at most one of each, in that order.

    scripts/soak --restart [--outage 30] [--rate 200]

Exits 1 on any finding. CI runs a shortened outage (.ci/run); the full form is the default.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "support")]  # apps, and the support

import ledger  # noqa: E402 - the tests' judge, shared
from pg_private import private_server, wait_accepting  # noqa: E402
from sv_harness import Supervisor  # noqa: E402 - the tests' process harness, shared

from workerproc.store import DEFAULT_BUSY_TIMEOUT, StoreError, open_store  # noqa: E402

RECOVERY_GOAL = 2.0  # seconds from the server's return to the pool's first finished run
BATCH_EVERY = 0.1
# an outage this long outlasts every reconnect (busy_timeout, retried in the driver's connect):
# each worker's call in flight or its idle check fails, so each tells the incident
TOLD_ABOVE = DEFAULT_BUSY_TIMEOUT + 1.0


class Producer(threading.Thread):
    """``rate`` runs/s in batches every 0.1 s, each run keyed; a batch that fails is sent again,
    same keys, until it is taken (a commit whose answer was lost is then not doubled)."""

    def __init__(self, url: str, rate: int, path: Path) -> None:
        super().__init__(daemon=True)
        self.url, self.per_batch, self.path = url, max(1, round(rate * BATCH_EVERY)), path
        self.stop = threading.Event()
        self.keys: list[str] = []
        self.ids: list[int] = []
        self.failures = 0

    def run(self) -> None:
        store = open_store(self.url)
        n = 0
        next_at = time.monotonic()
        try:
            while not self.stop.is_set():
                batch = [{"task": "step", "key": f"r{n + i}", "payload": {
                    "n": 0, "steps": 1, "sleep": 0, "ledger": str(self.path)}}
                    for i in range(self.per_batch)]  # fmt: skip
                while not self.stop.is_set():
                    try:
                        self.ids += store.start_runs(batch)
                        break
                    except StoreError:
                        self.failures += 1
                        time.sleep(0.2)
                else:
                    return
                self.keys += [str(item["key"]) for item in batch]
                n += self.per_batch
                next_at += BATCH_EVERY
                self.stop.wait(max(0.0, next_at - time.monotonic()))
        finally:
            store.close()


def _writes(run: Any) -> int:
    """How many times a succeeded run's one step was written (its state's own count)."""
    if run is None or run.status != "succeeded":
        return 0
    return len(run.state.get("writes", [])) if run.revision == 1 else run.revision


def worker_lines(sv: Supervisor) -> list[dict[str, Any]]:
    out = []
    for line in sv.text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def alive_across(lines: list[dict[str, Any]], down: float, back: float) -> list[int]:
    """The worker pids started before ``down`` and not exited before ``back`` (wall clock),
    from the supervisor's own events."""
    exited = {x.get("worker"): x.get("ts", 0) for x in lines if x.get("event") == "worker_exited"}
    return [x["worker"] for x in lines if x.get("event") == "worker_started"
            and x.get("ts", 0) < down and exited.get(x["worker"], float("inf")) > back]  # fmt: skip


def told(
    lines: list[dict[str, Any]], workers: list[int], down: float, back: float, strict: bool
) -> tuple[dict[int, str], list[str]]:
    """Each worker's incident lines over the run (``store_unavailable``/``store_back``:
    ``"1/1"``) and the findings: under ``strict`` every one of ``workers`` logs exactly one of
    each, the first in the outage (``down`` to ``back``, a second's slack), the second after it
    began; else at most one of each, a return never without its outage."""
    findings: list[str] = []
    seen: dict[int, str] = {}
    for pid in workers:
        mine = [x for x in lines if x.get("pid") == pid
                and x.get("event") in ("store_unavailable", "store_back")]  # fmt: skip
        gone = [x.get("ts", 0) for x in mine if x["event"] == "store_unavailable"]
        came = [x.get("ts", 0) for x in mine if x["event"] == "store_back"]
        seen[pid] = f"{len(gone)}/{len(came)}"
        if strict and (len(gone), len(came)) != (1, 1):
            findings.append(f"worker {pid} logged store_unavailable {len(gone)} times and "
                            f"store_back {len(came)} times (not once each)")  # fmt: skip
        elif len(gone) > 1 or len(came) > len(gone):
            findings.append(f"worker {pid}: store_unavailable {len(gone)}, store_back {len(came)}")
        elif gone and not down - 1 <= gone[0] <= back + 1:
            findings.append(f"worker {pid} logged store_unavailable outside the outage")
        elif came and came[0] < gone[0]:
            findings.append(f"worker {pid} logged store_back before store_unavailable")
    if strict and not workers:
        findings.append("no worker was alive across the outage")
    return seen, findings


def soak(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    findings: list[str] = []
    path = work / "ledger.jsonl"
    with private_server() as server:
        url = server.url() + "?schema=lkrestart"
        open_store(url).close()
        sv = Supervisor(work, "sv")
        sv.db = url
        sv.start("--lease-ttl", f"{args.ttl:g}", "--concurrency", str(args.concurrency),
                 app="apps.ledger_app:app", n=args.workers)  # fmt: skip
        producer = Producer(url, args.rate, path)
        try:
            producer.start()
            # the pool at work first (a worker booting while the server is away is another test)
            started = time.monotonic() + 300
            while time.monotonic() < started and not (path.exists() and path.stat().st_size):
                time.sleep(0.1)
            time.sleep(args.before)
            down_wall = time.time()
            server.stop("fast")
            time.sleep(args.outage)
            server.start()
            back = wait_accepting(server.url())
            back_wall = time.time() - (time.monotonic() - back)
            time.sleep(args.after)
            producer.stop.set()
            producer.join(60)
            deadline = time.monotonic() + 300
            with open_store(url) as store:
                while time.monotonic() < deadline:
                    if store.stats().runs.get("succeeded", 0) >= len(producer.keys):
                        break
                    time.sleep(0.5)
                stats = store.stats().runs
                unwritten = [i for i in producer.ids if _writes(store.get_run(i)) != 1]
        finally:
            producer.stop.set()
            sv.signal(signal.SIGTERM)
            code = sv.wait_exit(120)
            sv.kill_all()
        entries = ledger.read(path)
        after = sorted(e.t for e in entries if e.ev == "end" and e.t > back_wall)
        recovery = (after[0] - back_wall) if after else float("inf")
        if recovery > RECOVERY_GOAL:
            findings.append(f"the pool's first run after the return ended {recovery:.2f} s late")
        produced = len(producer.keys)
        if stats.get("succeeded", 0) != produced:
            findings.append(f"{stats} for {produced} runs handed over")
        findings += ledger.late_starts(entries)
        if unwritten:
            findings.append(f"{len(unwritten)} runs not written exactly once: {unwritten[:5]}")
        # a handler that ran again is a takeover after its lease lapsed (an outage longer
        # than the ttl: its commit was retried for a ttl, then given up), never on a live one
        ends = Counter(e.run for e in entries if e.ev == "end")
        twice = sum(k > 1 for k in ends.values())
        if code != 0:
            findings.append(f"the supervisor exited {code}: {sv.text()[-1500:]}")
        lines = worker_lines(sv)
        outage = [x for x in lines if down_wall - 1 <= x.get("ts", 0) <= back_wall + 5
                  and x.get("level") in ("warning", "error", "critical")]  # fmt: skip
        by_pid = Counter(x.get("pid") for x in outage)
        events = Counter(x.get("event") for x in outage)
        strict = args.outage >= TOLD_ABOVE
        workers = alive_across(lines, down_wall, back_wall)
        incident, unheard = told(lines, workers, down_wall, back_wall, strict)
        findings += unheard
        if by_pid and max(by_pid.values()) > args.line_bound:
            findings.append(f"more than {args.line_bound} warning lines per process in the "
                            f"incident: {dict(by_pid)} ({dict(events)})")  # fmt: skip
    return {
        "outage": args.outage,
        "rate": args.rate,
        "produced": produced,
        "producer_retries": producer.failures,
        "recovery": round(recovery, 3),
        "starts": sum(e.ev == "start" for e in entries),
        "ran_twice": twice,
        "warning_lines": dict(events),
        "most_lines_per_process": max(by_pid.values()) if by_pid else 0,
        "told": incident,
        "strict": strict,
        "findings": findings,
    }


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--outage", type=float, default=30.0, help="seconds the server is down (30)")
    ap.add_argument("--rate", type=int, default=200, help="runs/s handed over (200)")
    ap.add_argument("--before", type=float, default=5.0, help="seconds of load before (5)")
    ap.add_argument("--after", type=float, default=10.0, help="seconds of load after (10)")
    ap.add_argument("--ttl", type=float, default=60.0, help="the lease ttl (60, the default)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    ap.add_argument("--concurrency", type=int, default=8, help="slots per worker (8)")
    ap.add_argument("--line-bound", type=int, default=6,
                    help="warning lines a process may log in one incident (6)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_arguments(ap)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lk-restart-") as tmp:
        r = soak(args, Path(tmp))
    print(f"| restart ({r['outage']:g} s down, {r['rate']} runs/s) | runs | recovery (s) "
          "| handler starts | ran again after a lapse | warning lines in the incident "
          "| findings |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
    most = r["most_lines_per_process"]
    print(f"| pg_ctl stop -m fast ... start | {r['produced']:,} | {r['recovery']:.2f} | "
          f"{r['starts']:,} | {r['ran_twice']} | {r['warning_lines']} (at most {most} a "
          f"process) | {len(r['findings'])} |")  # fmt: skip
    rule = "exactly once each" if r["strict"] else f"at most once (outage < {TOLD_ABOVE:g} s)"
    print(f"store_unavailable/store_back per worker alive across the outage ({rule}): "
          f"{', '.join(f'{pid}: {n}' for pid, n in r['told'].items()) or 'none'}")  # fmt: skip
    for finding in r["findings"][:20]:
        print(f"restart: {finding}", file=sys.stderr)
    return 1 if r["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
