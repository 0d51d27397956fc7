"""The partition soak: hosts (network namespaces, netns.py) each run a supervisor against one
private PostgreSQL (pg_private.py); runs flow in all along while one host is cut off from the
database for each of ``cuts`` seconds in turn, then healed. The handlers keep a ledger
(tests/apps/ledger_app.py); after the last heal every run must finish and the ledger and the
database are judged:

- at most one handler of a task ran on a live lease: attempts start in order
  (``ledger.late_starts``), and a handler of attempt k had ended (or learned its lease was lost)
  before attempt k+1 began (``overlaps``): the cut-off host stops its handlers at their local
  deadline, before the database lets anyone take them over;
- no zombie write accepted: every run succeeded with exactly one committed write per step;
- no run failed; the database's own integrity check is clean;
- the cut-off host's workers claimed again after each heal, within ``RESUME_BOUND`` (its
  workers' pids say whether any restarted).

Used by tests/chaos/test_partition.py (short cuts) and ``scripts/soak --pressure`` (1, 10 and
60 s).
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ledger
import netns
import pg_private
from sv_harness import Supervisor

from workerproc.store import open_store

TTL = 2.0
RESUME_BOUND = 2 * TTL + 5.0  # after a heal: reconnect (a few backoffs) and claim
SETTLE = 3 * TTL  # between cuts: the pool back to normal
STEPS = 3
PAYLOAD = {"n": 0, "steps": STEPS, "sleep": 0.05, "sleep_max": 3.0}  # some outlast the ttl


def overlaps(entries: Sequence[ledger.Entry]) -> list[str]:
    """A handler of attempt k still running (no ``end``, no ``lost`` yet) when a later attempt
    of its task started: two handlers of one task at once."""
    began: dict[tuple[int, int], ledger.Entry] = {}
    over: dict[tuple[int, int], float] = {}
    for e in entries:
        if e.ev == "start":
            began[(e.task, e.attempt)] = e
        elif e.ev in ("end", "lost"):
            over[(e.task, e.attempt)] = min(e.t, over.get((e.task, e.attempt), e.t))
    found = []
    for (task, attempt), start in began.items():
        for (other_task, later), other in began.items():
            if other_task != task or later <= attempt or other.t < start.t:
                continue
            ended = over.get((task, attempt))
            if ended is None or ended > other.t:
                what = "never ended" if ended is None else f"ended {ended - other.t:.3f} s after"
                found.append(f"task {task}: attempt {attempt} (pid {start.pid}) {what} "
                             f"attempt {later} (pid {other.pid}) started")  # fmt: skip
    return found


class Producer(threading.Thread):
    """Starts ``rate`` runs a second until stopped (one batch per tick)."""

    def __init__(self, url: str, rate: float, ledger_path: Path) -> None:
        super().__init__(name="producer", daemon=True)
        self.url, self.rate, self.path = url, rate, str(ledger_path)
        self.run_ids: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        tick = 0.2
        with open_store(self.url) as store:
            while not self.stop.wait(tick):
                batch = max(1, round(self.rate * tick))
                payload = {**PAYLOAD, "ledger": self.path}
                self.run_ids += store.start_runs([{"task": "step", "payload": payload}] * batch)


def _host_pids(sv: Supervisor) -> set[int]:
    return set(sv.workers())


def _resumed(entries: Sequence[ledger.Entry], pids: set[int], after: float) -> float | None:
    """Seconds from ``after`` to the first handler start of ``pids`` (None: none yet)."""
    times = [e.t for e in entries if e.ev == "start" and e.pid in pids and e.t >= after]
    return min(times) - after if times else None


def soak(work: Path, cuts: Sequence[float], *, hosts: int = 3, workers: int = 2,
         rate: float = 3.0) -> dict[str, Any]:  # fmt: skip
    """Run the soak; returns its figures and ``findings`` (empty: it passed)."""
    findings: list[str] = []
    path = work / "ledger.jsonl"
    schema = f"lk_part_{secrets.token_hex(4)}"
    figures: list[dict[str, Any]] = []
    began = time.monotonic()
    with netns.hosts(hosts) as nets, pg_private.private_server([h.gateway for h in nets]) as pg:
        local = f"{pg.url()}?schema={schema}"
        with open_store(local):
            pass  # the schema, made once before the hosts start
        sups = []
        try:
            for k, host in enumerate(nets):
                sv = Supervisor(work, f"host{k + 1}")
                sv.db = f"{pg.url(host.gateway)}?schema={schema}"
                sv.command = host.wrap(sv.command)
                sv.start("--lease-ttl", str(TTL), "--poll-interval", "0.2", "--concurrency", "4",
                         n=workers, app="apps.ledger_app:app")  # fmt: skip
                sups.append(sv)
            for sv in sups:
                sv.wait_workers(workers, timeout=60)
            producer = Producer(local, rate, path)
            producer.start()
            time.sleep(SETTLE)
            victim, sv = nets[0], sups[0]
            for seconds in cuts:
                before = _host_pids(sv)
                victim.cut()
                cut_at = time.time()
                time.sleep(seconds)
                victim.heal()
                healed = time.time()
                deadline = time.monotonic() + RESUME_BOUND + 30
                resumed = None
                while resumed is None and time.monotonic() < deadline:
                    time.sleep(0.25)
                    resumed = _resumed(ledger.read(path), _host_pids(sv) | before, healed)
                after = _host_pids(sv)
                figures.append({"cut_s": seconds, "cut_at": cut_at,
                                "resumed_after_s": None if resumed is None else round(resumed, 2),
                                "restarted_workers": len(before - after)})  # fmt: skip
                if resumed is None or resumed > RESUME_BOUND:
                    findings.append(f"cut of {seconds:g} s: host 1's workers claimed nothing "
                                    f"for {RESUME_BOUND:g} s after the heal")  # fmt: skip
                time.sleep(SETTLE)
            producer.stop.set()
            producer.join(30)
            findings += _finish(local, producer.run_ids, timeout=120 + 2 * sum(cuts))
        finally:
            for host in nets:
                with contextlib.suppress(Exception):
                    host.heal()
            for sv in sups:
                sv.kill_all()
        entries = ledger.read(path)
        findings += ledger.late_starts(entries) + overlaps(entries)
        with open_store(local) as store:
            findings += store.integrity_violations()
            rejected = len(store.fence_rejections())
        logs = {f"host{k + 1}": _outage_lines(sv) for k, sv in enumerate(sups)}
    return {
        "seconds": round(time.monotonic() - began, 1),
        "runs": len(producer.run_ids),
        "starts": sum(e.ev == "start" for e in entries),
        "lost": sum(e.ev == "lost" for e in entries),
        "zombie_writes_rejected": rejected,
        "cuts": figures,
        "outage_log_lines": logs,
        "findings": findings,
    }


def _finish(url: str, run_ids: list[int], timeout: float) -> list[str]:
    """Wait until every run is over; then each must have succeeded, one write per step."""
    deadline = time.monotonic() + timeout
    with open_store(url) as store:
        while time.monotonic() < deadline:
            if all((r := store.get_run(i)) is not None and r.terminal for i in run_ids):
                break
            time.sleep(0.5)
        found = []
        for run_id in run_ids:
            run = store.get_run(run_id)
            if run is None or run.status != "succeeded":
                found.append(f"run {run_id} did not succeed: {run}")
                continue
            steps = [w["step"] for w in run.state["writes"]]
            if steps != list(range(STEPS)) or run.revision != STEPS:
                found.append(f"run {run_id}: writes {run.state['writes']} at revision "
                             f"{run.revision} (a zombie write?)")  # fmt: skip
    return found


def _outage_lines(sv: Supervisor) -> dict[str, int]:
    """How often the host's workers said the database was gone, and back."""
    return {name: len(sv.events(name)) for name in ("store_unavailable", "store_back")}
