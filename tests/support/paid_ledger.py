"""The chaos soak of paid calls (B13), judged by an OUTSIDE ledger (tests/apps/paid_app.py):
runs of one paid call each under kill+pause chaos (PostgreSQL: two supervisors sharing the
database; SQLite: one, see ``run_soak``).
tests/chaos/test_paid_chaos.py runs it small; scripts/soak_paid.py runs the acceptance's 300 runs.

What the ledger proves, against what the database and the chaos reports say:

- **Every extra payment is a call in flight at a fault.** A step's calls (its ``bill`` lines)
  beyond the first are extra payments. Each call followed by another call of its step must have
  been struck: a fault (kill or pause, from the chaos reports) on its attempt before fn
  returned (no ``paid`` line, or one written after the fault: a paused zombie's), *in flight*;
  or after fn returned, before its answer was kept: in the keep's own few milliseconds
  (``KEEP_WINDOW_MOST`` per soak at most). Calls are ordered by attempt (the order of their
  intents: an intent is written only under its attempt's live lease), not by when fn began.
- **No attempt that began after a ``once`` of its step returned calls fn** (the answer was
  kept by then), but a zombie a pause froze between its intent and its fn: on waking it goes
  straight into fn (``once`` does not look at the lease or the kept answer again), an extra
  payment the fault caused, counted as in flight. An attempt whose lookup ran just before the
  keep landed may bill just after it: counted (``raced``), not a finding.
- **Every once returned the first kept answer**: the answer of the attempt the database kept
  (``paid_calls``), as that attempt's fn returned it (its ``paid`` line, nonce and all).
- **The counts never undercount**: ``paid_again`` >= the extra payments; every intent without a
  call in the ledger (paid_again's excess over them) is an attempt a fault struck between its
  intent and its fn; each chaos report counts what the database does.
- Every run succeeded, the database's own checks pass, the chaos verifiers found nothing.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sv_harness import Supervisor

from workerproc.store import open_store

APP = "apps.paid_app:app"
KEEP_WINDOW_MOST = 2  # faults struck between fn's return and its keep, per soak
CHAOS = ["--drain", "--lease-ttl", "1", "--poll-interval", "0.2", "--prefetch", "0",
         "--max-attempts", "20", "--chaos", "--chaos-faults", "kill,pause"]  # fmt: skip
CALL = (0.1, 0.5)  # fn's time: faults land inside calls far more than in the keep
WORK = (0.05, 0.15)  # the step's own work after the call


@dataclass(frozen=True)
class Fault:
    fault: str
    pid: int
    task: int
    attempt: int
    t: float


@dataclass
class Soak:
    """What one soak saw: its figures and its findings (empty: it passed)."""

    name: str
    runs: int
    seconds: float = 0.0
    figures: dict[str, float] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)

    def line(self) -> str:
        f = self.figures
        return (f"[{self.name}] {self.runs} runs in {self.seconds:.0f} s: extra payments "
                f"{f['extra']} (in flight at a fault {f['in_flight']}, in the keep's window "
                f"{f['keep_window']}); paid_again {f['paid_again']}, unknown {f['unknown']}, "
                f"started {f['started']}, kept {f['kept']}, reused {f['reused']}; calls billed "
                f"{f['bills']}, intents without a call {f['intent_only']}, zombies that woke into "
                f"their call after the keep {f['woke_into']}, calls begun as the answer was "
                f"kept {f['raced']}; faults {f['faults']} "
                f"({f['kills']} kill, {f['pauses']} pause), {f['leases_hit']} leases hit, "
                f"{f['calls_hit']} calls in flight hit; fn's return -> once's return p50 "
                f"{f['keep_p50_ms']} ms, p99 {f['keep_p99_ms']} ms")  # fmt: skip


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def faults_of(reports: list[dict[str, Any]]) -> list[Fault]:
    return [Fault(e["fault"], e["pid"], e["task_id"], e["attempt"], e["t"])
            for r in reports for e in r["events"]]  # fmt: skip


def run_soak(
    work: Path, db: str, name: str, runs: int, supervisors: int = 2, timeout: float = 600.0
) -> Soak:
    """``runs`` runs of ``pay`` on ``db`` under chaos, then the judgement: ``supervisors`` of
    them sharing the database, a fault every 0.5 s in all. One: ``-n 4 --concurrency 2``. Two
    (a fault every 1 s each): ``-n 2 --concurrency 2`` beside ``-n 4``, so calls are made both
    ways: on a slot thread, with its own connection, and from the main thread, handed to the
    worker's paid-call thread (``--concurrency 1``, the default).

    SQLite runs one (scripts/soak-paid's does): a second supervisor's chaos strikes workers
    whose keeps wait for the write lock while the first one holds a frozen victim that holds
    it (a pause is spared when the victim holds the write lock, but only after a probe of up to
    0.25 s, during which every writer waits), which measures chaos's stall, not the keep."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / "ledger.jsonl"
    payload = {"ledger": str(path), "call": CALL, "work": WORK}
    with open_store(db) as store:
        run_ids = store.start_runs([{"task": "pay", "payload": payload}] * runs)
    sups = [Supervisor(work, f"sv{i + 1}") for i in range(supervisors)]
    reports = [work / f"chaos{i + 1}.json" for i in range(supervisors)]
    interval = str(0.5 * supervisors)
    shapes = [(4, 2)] if supervisors == 1 else [(2, 2), (4, 1)] * (supervisors // 2)
    began = time.monotonic()
    try:
        for i, sv in enumerate(sups):
            sv.db = db
            workers, slots = shapes[i % len(shapes)]
            sv.start(*CHAOS, "--chaos-interval", interval, "--chaos-seed", str(37 + i),
                     "--concurrency", str(slots), "--chaos-report", str(reports[i]), app=APP,
                     n=workers)  # fmt: skip
        codes = [sv.wait_exit(timeout) for sv in sups]
    finally:
        for sv in sups:
            sv.kill_all()
    soak = Soak(name, runs, time.monotonic() - began)
    if any(codes):
        soak.findings.append(f"the supervisors exited {codes}: "
                             + "".join(sv.text()[-2000:] for sv in sups))  # fmt: skip
    docs = [json.loads(r.read_text()) for r in reports if r.exists()]
    soak.findings += [v for d in docs for v in d["violations"]]
    judge(soak, db, run_ids, read(path), docs)
    return soak


def judge(
    soak: Soak, db: str, run_ids: list[int], log: list[dict[str, Any]],
    reports: list[dict[str, Any]],
) -> None:  # fmt: skip
    out = soak.findings
    faults = faults_of(reports)
    by_attempt: dict[tuple[int, int], list[Fault]] = defaultdict(list)
    for f in faults:
        by_attempt[(f.task, f.attempt)].append(f)
    with open_store(db) as store:
        runs = {r: store.get_run(r) for r in run_ids}
        out += [f"run {r}: {run.status if run else None}" for r, run in runs.items()
                if run is None or run.status != "succeeded"]  # fmt: skip
        out += store.integrity_violations()
        kept = {c.task_id: c for r in run_ids for c in store.paid_calls(r) if c.kept}
        intents = [i for r in run_ids for i in store.call_timeline(r)]
        totals = store.paid_call_totals()
    bills: dict[int, list[dict[str, Any]]] = defaultdict(list)
    paid: dict[tuple[int, int], dict[str, Any]] = {}
    onces: list[dict[str, Any]] = []
    starts: dict[tuple[int, int], float] = {}
    for e in log:
        if e["ev"] == "start":
            starts[(e["task"], e["attempt"])] = e["t"]
        elif e["ev"] == "bill":
            bills[e["task"]].append(e)
        elif e["ev"] == "paid":
            paid[(e["task"], e["attempt"])] = e
        elif e["ev"] == "once":
            onces.append(e)
    tasks = {e["task"] for e in log if e["ev"] == "start"}
    out += [f"task {t}: no answer kept" for t in sorted(tasks - set(kept))]
    # no attempt that began after a once of its step returned (its answer was kept by then)
    # calls fn, but a zombie a pause froze between its intent and its fn: it wakes into the call.
    # (An attempt that began before may bill just after: its lookup ran before the keep landed.)
    first_once: dict[int, float] = {}
    for e in onces:
        first_once[e["task"]] = min(first_once.get(e["task"], e["t"]), e["t"])
    woke_into = raced = 0
    for calls in bills.values():
        for e in calls:
            kept_at = first_once.get(e["task"], float("inf"))
            if e["t"] <= kept_at:
                continue
            if any(f.t < e["t"] for f in by_attempt.get((e["task"], e["attempt"]), [])):
                woke_into += 1
            elif starts[(e["task"], e["attempt"])] < kept_at:
                raced += 1
            else:
                out.append(f"task {e['task']} attempt {e['attempt']}: began "
                           f"{starts[(e['task'], e['attempt'])] - kept_at:.3f} s after its step's "
                           "answer was kept, and paid for it")  # fmt: skip
    # every extra payment follows a call that a fault struck: each call (in attempt order, the
    # order of their intents) that another call of its step followed
    extra = in_flight = keep_window = 0
    for task, calls in bills.items():
        calls.sort(key=lambda e: e["attempt"])
        extra += len(calls) - 1
        for e in calls[:-1]:
            returned = paid.get((task, e["attempt"]))
            struck = by_attempt.get((task, e["attempt"]), [])
            if any(returned is None or f.t < returned["t"] for f in struck):
                in_flight += 1
            elif struck:
                keep_window += 1
            else:
                out.append(f"task {task} attempt {e['attempt']}: paid again after a call no "
                           f"fault struck (returned: {returned is not None})")  # fmt: skip
    if keep_window > KEEP_WINDOW_MOST:
        out.append(f"{keep_window} calls paid again after a fault between fn's return and its "
                   f"keep (at most {KEEP_WINDOW_MOST})")  # fmt: skip
    # every once returned the first kept answer, as its paying attempt's fn returned it
    for e in onces:
        call = kept.get(e["task"])
        first = None if call is None else paid.get((e["task"], call.attempt))
        if first is None or e["answer"] != first["answer"]:
            out.append(f"task {e['task']} attempt {e['attempt']}: once returned {e['answer']}, "
                       f"the kept answer is {first and first['answer']}")  # fmt: skip
    # the counts: paid again is at least the ledger's extra payments, and what it counts beyond
    # them are intents whose attempt a fault struck before its fn began
    billed = {(e["task"], e["attempt"]) for calls in bills.values() for e in calls}
    intent_only = [i for i in intents if (i.task_id, i.attempt) not in billed]
    out += [f"task {i.task_id} attempt {i.attempt}: an intent without a call, and no fault"
            for i in intent_only if (i.task_id, i.attempt) not in by_attempt]  # fmt: skip
    if totals.paid_again < extra:
        out.append(f"paid_again {totals.paid_again} < {extra} extra payments in the ledger")
    if totals.started != len(intents) or len(intents) < len(billed):
        out.append(f"started {totals.started}, {len(intents)} intents, {len(billed)} calls")
    # each supervisor's chaos report says the same (written after the drain: no call begins
    # after it, as none begins without a live lease)
    want = {"started": totals.started, "kept": totals.kept, "paid_again": totals.paid_again}
    for i, doc in enumerate(reports):
        counted = doc.get("paid_calls") or {}
        got = {k: counted.get(k) for k in want}
        if got != want:
            out.append(f"chaos report {i + 1} counts {got}, the database {want}")
    # fn's return -> once's return, as the ledger saw it (under chaos: not the benchmark's figure)
    keeps = sorted(e["t"] - paid[(e["task"], e["attempt"])]["t"] for e in onces
                   if not e["reused"] and (e["task"], e["attempt"]) in paid)  # fmt: skip
    kinds = Counter(f.fault for f in {(f.fault, f.pid, f.t): f for f in faults}.values())
    soak.figures = {
        "extra": extra, "in_flight": in_flight, "keep_window": keep_window,
        "paid_again": totals.paid_again, "unknown": totals.unknown, "started": totals.started,
        "kept": totals.kept, "reused": totals.reused, "bills": len(billed),
        "intent_only": len(intent_only), "woke_into": woke_into, "raced": raced,
        "faults": kinds["kill"] + kinds["pause"], "kills": kinds["kill"],
        "pauses": kinds["pause"], "leases_hit": len(faults),
        "calls_hit": sum(1 for key in billed if key in by_attempt
                         and any(key not in paid or f.t < paid[key]["t"]
                                 for f in by_attempt[key])),
        "keep_p50_ms": round(1000 * quantile(keeps, 0.5), 1),
        "keep_p99_ms": round(1000 * quantile(keeps, 0.99), 1),
    }  # fmt: skip


def quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0
