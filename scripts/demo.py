"""leasekeeper's demo: a few hundred runs of a simulated three-step agent on ./demo.db, processed by
`supervisor start -n 8 --chaos --drain` while chaos mode SIGKILLs and SIGSTOPs its own workers.

Afterwards the database — not the workers — tells what happened: runs succeeded or failed, how
many executions the steps took, and how many tokens re-executions spent that a pool without
leases and fencing would have billed twice (with them: none is charged twice into a run's state).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from demoapp import STEPS, tokens_for

from supervisor.chaos.report import counts_line
from workerproc.store import open_store

HERE = Path(__file__).resolve().parent
SHOW = ("chaos", "drain finished", "VIOLATION", "supervisor stopped", "error", "Error")


def fresh(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", ".lock", "-producers"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def enqueue(db: Path, runs: int) -> None:
    store = open_store(str(db))
    try:
        for i in range(runs):
            store.start_run("prepare", {"doc": f"resume-{i:04d}.pdf"}, state={"tokens": 0})
    finally:
        store.close()


def supervise(db: Path, report: Path, args: argparse.Namespace) -> int:
    cmd = [
        sys.executable, "-m", "supervisor", "start", "-n", str(args.workers),
        "--db", str(db), "--app", "demoapp:app", "--drain",
        "--lease-ttl", str(args.ttl), "--poll-interval", "0.5", "--max-attempts", "5",
        "--chaos", "--chaos-interval", str(args.interval), "--chaos-seed", str(args.seed),
        "--chaos-report", str(report),
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, bufsize=1)
    assert proc.stderr is not None
    in_report = False
    for line in proc.stderr:  # show the faults as they land, and the report at the end
        in_report = in_report or line.startswith("chaos report")
        if in_report or any(word in line for word in SHOW):
            print("  " + line.rstrip()[:150] if not in_report else line.rstrip(), flush=True)
    return proc.wait()


def ledger(db: Path) -> dict[str, int]:
    """What the database says: per run, the state billed each step once, or not."""
    store = open_store(str(db))
    try:
        out = dict.fromkeys(
            ("succeeded", "failed", "other", "steps", "executions", "billed", "respent", "twice",
             "reused", "saved"),
            0,
        )  # fmt: skip
        for run in store.list_runs(limit=1_000_000):
            out[run.status if run.status in ("succeeded", "failed") else "other"] += 1
            billed = (run.state or {}).get("billed", {})
            reused = {c.task_id: c.reused for c in store.paid_calls(run.id)}  # ctx.once's
            for task in store.get_tasks(run.id):
                cost = tokens_for(run.id, task.name)
                out["executions"] += task.attempts
                if task.done_at is not None:
                    out["steps"] += 1
                # every re-run pays again, but one that reused the kept answer
                again = reused.get(task.id, 0)
                out["respent"] += cost * max(0, task.attempts - 1 - again)
                out["reused"] += again
                out["saved"] += cost * again
            for step in STEPS:
                if step in billed:
                    out["billed"] += billed[step]
                    out["twice"] += billed[step] != tokens_for(run.id, step)
        return out
    finally:
        store.close()


def paid_calls_line(counts: dict[str, int] | None) -> str:
    """The chaos report's count of every paid call (ctx.once), in one line."""
    if not counts or "started" not in counts:
        return "not counted (no chaos report)"
    return counts_line(counts) + " (paid again: an upper bound of second payments)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--ttl", type=float, default=2.0)
    ap.add_argument("--interval", type=float, default=0.7, help="mean seconds between faults")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--db", default="demo.db")
    args = ap.parse_args()
    db = Path(args.db).resolve()
    report = db.with_name(db.stem + "-chaos.json")
    fresh(db)
    enqueue(db, args.runs)
    print(f"enqueued {args.runs} runs of prepare -> call (a simulated model) -> complete")
    print(
        f"supervisor start -n {args.workers} --chaos --drain  (ttl {args.ttl:g} s, a fault "
        f"every ~{args.interval:g} s, seed {args.seed}) on {db}\n",
        flush=True,
    )
    started = time.monotonic()
    code = supervise(db, report, args)
    elapsed = time.monotonic() - started
    doc = json.loads(report.read_text()) if report.exists() else {}
    led = ledger(db)
    by_fault = doc.get("takeover_ms_by_fault", {})
    kill, pause = by_fault.get("kill", {}), by_fault.get("pause", {})
    faults = doc.get("faults", {})
    rerun = led["executions"] - led["steps"]
    rows = [
        ("runs", f"{led['succeeded']} succeeded, {led['failed']} failed, {led['other']} other"),
        ("steps committed", f"{led['steps']}"),
        ("executions started", f"{led['executions']} ({rerun} re-run after a fault or an error)"),
        ("tokens billed into runs", f"{led['billed']:,} (each step once)"),
        ("tokens spent by re-runs", f"{led['respent']:,} (billed twice without leases)"),
        ("tokens saved by reuse", f"{led['saved']:,} ({led['reused']} calls reused: ctx.once)"),
        ("tokens charged twice", f"{led['twice']}"),
        ("paid calls", paid_calls_line(doc.get("paid_calls"))),
        ("faults", f"{faults.get('kill')} kill, {faults.get('pause')} pause"),
        ("takeover after a kill", f"p50 {kill.get('p50')} ms, p99 {kill.get('p99')} ms (fast)"),
        ("takeover after a pause", f"p50 {pause.get('p50')} ms, p99 {pause.get('p99')} ms (ttl)"),
        ("zombie writes rejected", f"{doc.get('zombie_writes_rejected')}"),
        ("violations", f"{len(doc.get('violations', []))}"),
        ("elapsed", f"{elapsed:.1f} s, supervisor exit code {code}"),
    ]
    print()
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    print(f"\nthe full report: {report}")
    if code != 0 or led["twice"] or not doc.get("ok"):
        return code or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
