"""The staging soak, judged by the handlers' own ledger: does any handler start on a
lease another worker already took over, under kills and pauses?

1,000 runs x 3 steps, ``--lease-ttl 1``, ``--chaos --chaos-interval 0.25 --chaos-faults
kill,pause``, ``--max-attempts 20``. SQLite: one supervisor, ``-n 2 --concurrency 8``, plain
handlers and ``async def`` ones. PostgreSQL: two supervisors of ``-n 4`` on one database. Every
handler appends ``start``/``end``/``lost`` lines to an O_APPEND ledger (tests/apps/ledger_app.py);
tests/support/ledger.py judges it: no handler of attempt k starts after attempt k+1 of its task
began, and no live worker loses a lease within 100 ms of a start. The chaos verifier's own verdict
and every run's single write per step are checked too.

    scripts/soak [--backends sqlite,postgres,pgbouncer] [--runs 1000]
    scripts/soak --restart [--outage 30] [--rate 200]   a server restart (scripts/soak_restart.py)
    scripts/soak --pressure [--blocked-minutes 20]

``--pressure`` runs the real-deployment pressures instead, each on a private PostgreSQL (as root:
tests/support/partition.py and vacuum_blocked.py): three hosts as network namespaces, one cut off
from the database for 1, 10 and 60 s while runs flow, judged by the handlers' ledger; then 200
runs/s while another client holds a transaction open for 20 minutes (vacuum cannot remove a dead
row), and the recovery after it ends (about 35 minutes in all). tests/chaos/test_partition.py and
test_vacuum_blocked.py are their short forms.

Exits 1 on any finding. About 4 minutes on 2 cores. PostgreSQL: ``LEASEKEEPER_TEST_POSTGRES``
(default postgresql://postgres@127.0.0.1:5432/test), in a schema of its own, dropped after.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "support")]  # apps, and the support

import ledger  # noqa: E402 - the tests' judge, shared
from sv_harness import Supervisor  # noqa: E402 - the tests' process harness, shared

from workerproc.store import open_store  # noqa: E402

ADMIN = os.environ.get("LEASEKEEPER_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
CHAOS = ["--drain", "--lease-ttl", "1", "--poll-interval", "0.2", "--max-attempts", "20",
         "--chaos", "--chaos-interval", "0.25", "--chaos-faults", "kill,pause"]  # fmt: skip


def soak(name: str, work: Path, url: str | None, task: str, runs: int) -> dict[str, Any]:
    work.mkdir(parents=True)
    path = work / "ledger.jsonl"
    if url is None:
        sups = [(Supervisor(work, "sv1"), 2, ["--concurrency", "8"])]
    else:
        sups = [(Supervisor(work, "sv1"), 4, []), (Supervisor(work, "sv2"), 4, [])]
        for sv, _, _ in sups:
            sv.db = url
    db = sups[0][0].db
    payload = {"n": 0, "steps": 3, "sleep": 0.01, "sleep_max": 0.05, "ledger": str(path)}
    with open_store(db) as store:
        run_ids = store.start_runs([{"task": task, "payload": payload}] * runs)
    began = time.monotonic()
    reports = []
    try:
        for i, (sv, n, extra) in enumerate(sups):
            report = work / f"chaos{i}.json"
            sv.start(*CHAOS, "--chaos-seed", str(1 + i), "--chaos-report", str(report), *extra,
                     app="apps.ledger_app:app", n=n)  # fmt: skip
            reports.append(report)
        codes = [sv.wait_exit(900) for sv, _, _ in sups]
    finally:
        for sv, _, _ in sups:
            sv.kill_all()
    docs = [json.loads(r.read_text()) for r in reports]
    entries = ledger.read(path)
    findings = ledger.late_starts(entries) + ledger.doomed_starts(entries, ledger.pauses(docs))
    findings += [v for d in docs for v in d["violations"]]
    findings += [f"a supervisor exited {c}" for c in codes if c != 0]
    with open_store(db) as store:
        for run_id in run_ids:
            run = store.get_run(run_id)
            if run is None or run.status != "succeeded" or run.revision != 3:
                findings.append(f"run {run_id}: {run}")
    return {
        "soak": name,
        "seconds": round(time.monotonic() - began, 1),
        "starts": sum(e.ev == "start" for e in entries),
        "kills": sum(d["faults"]["kill"] for d in docs),
        "pauses": sum(d["faults"]["pause"] for d in docs),
        "findings": findings,
    }


def pressure(blocked_minutes: float) -> int:
    import partition  # noqa: PLC0415 - only --pressure needs them (and root)
    import vacuum_blocked  # noqa: PLC0415

    def stop(signum: int, _frame: object) -> None:  # the finally blocks tidy up
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    with tempfile.TemporaryDirectory(prefix="lk-pressure-") as tmp:
        cut = partition.soak(Path(tmp), [1.0, 10.0, 60.0])
        print("| cut (s) | host 1 claimed again after the heal (s) | workers restarted |")
        print("| ---: | ---: | ---: |")
        for c in cut["cuts"]:
            print(f"| {c['cut_s']:g} | {c['resumed_after_s']} | {c['restarted_workers']} |")
        print(f"partition: {cut['runs']:,} runs, {cut['starts']:,} handler starts, "
              f"{cut['lost']} lost leases, {cut['zombie_writes_rejected']} zombie writes "
              f"rejected, outage lines {cut['outage_log_lines']}, {cut['seconds']} s")  # fmt: skip
        vac = vacuum_blocked.soak(Path(tmp), clean_s=120, blocked_s=60 * blocked_minutes,
                                  recovery_s=300, say=print)  # fmt: skip
    print(
        "| phase | claim p50 (ms) | claim p99 (ms, worst window) | ready depth (max) "
        "| dead rows in runs (max) |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for phase in ("clean", "blocked", "recovery"):
        f = vac[phase]
        print(f"| {phase} ({f.get('seconds')} s) | {f.get('p50')} | {f.get('p99')} | "
              f"{f.get('depth')} | {f.get('dead_runs')} |")  # fmt: skip
    findings = list(cut["findings"])
    clean, blocked = vac["clean"]["p99"], vac["blocked"]["p99"]
    if blocked > 3 * max(clean, vacuum_blocked.FLOOR_MS):
        findings.append(f"claim p99 {blocked} ms while vacuum was blocked: over 3x {clean} ms")
    floor = max(clean, vacuum_blocked.FLOOR_MS)
    last = vac["recovery"]
    backlog = vacuum_blocked.BACKLOG_S * vac["rate"]
    if last["last_p99"] > vacuum_blocked.RECOVERED * floor or last["last_depth"] > backlog:
        findings.append(f"not back to the clean figures after 5 minutes: {last}")
    for finding in findings[:20]:
        print(finding, file=sys.stderr)
    return 1 if findings else 0


def main() -> int:
    if sys.argv[1:2] == ["--restart"]:  # the server restart soak (scripts/soak_restart.py)
        import soak_restart  # noqa: PLC0415 - only this mode needs it

        return soak_restart.main(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="sqlite,postgres",
                    help="some of sqlite, postgres, pgbouncer (PostgreSQL through a private "
                    "PgBouncer in transaction mode)")  # fmt: skip
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--pressure", action="store_true", help="partitions and a blocked vacuum")
    ap.add_argument("--blocked-minutes", type=float, default=20.0)
    args = ap.parse_args()
    if args.pressure:
        return pressure(args.blocked_minutes)
    backends = args.backends.split(",")
    results = []
    with tempfile.TemporaryDirectory(prefix="lk-soak-") as tmp:
        if "sqlite" in backends:
            for task in ("step", "astep"):
                results.append(soak(f"SQLite -n 2 --concurrency 8 ({task})",
                                    Path(tmp) / task, None, task, args.runs))  # fmt: skip
        if "postgres" in backends:
            import psycopg  # noqa: PLC0415 - only this part needs it

            schema = f"lk_soak_{secrets.token_hex(4)}"
            url = f"{ADMIN}{'&' if '?' in ADMIN else '?'}schema={schema}"
            try:
                results.append(soak("PostgreSQL, two supervisors -n 4", Path(tmp) / "pg", url,
                                    "step", args.runs))  # fmt: skip
            finally:
                with psycopg.connect(ADMIN, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        if "pgbouncer" in backends:
            import pgbouncer  # noqa: PLC0415 - only this part needs it
            import psycopg  # noqa: PLC0415

            schema = f"lk_soak_{secrets.token_hex(4)}"
            url = f"{ADMIN}{'&' if '?' in ADMIN else '?'}schema={schema}"
            try:
                with pgbouncer.running(ADMIN) as bouncer:
                    results.append(soak("PostgreSQL through PgBouncer (transaction mode), two "
                                        "supervisors -n 4", Path(tmp) / "pgb",
                                        bouncer.url(url), "step", args.runs))  # fmt: skip
            finally:
                with psycopg.connect(ADMIN, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    print(f"| soak ({args.runs:,} runs x 3 steps, ttl 1 s, a fault every 0.25 s) | seconds "
          "| handler starts | kills | pauses | findings |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r['soak']} | {r['seconds']} | {r['starts']:,} | {r['kills']} | "
              f"{r['pauses']} | {len(r['findings'])} |")  # fmt: skip
    for r in results:
        for finding in r["findings"][:20]:
            print(f"{r['soak']}: {finding}", file=sys.stderr)
    return 1 if any(r["findings"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
