"""The worker processes of every host, kept in the database by their heartbeats:
``status --db URL``, the dashboard and a producer see that a pool is claiming, where and with
how many slots, without a pidfile on that host (Solid Queue's processes table is the model).

A worker writes its row when it starts and at every heartbeat period (one small statement; on
PostgreSQL a HOT update), and deletes it when it stops cleanly. A worker killed outright leaves
its row behind: it reads as not ``alive`` once it has been silent for three of its periods,
and the next worker to start deletes rows silent for ten of them (and a minute).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from ..codec import check_owner, check_queue, check_served, check_text, served_entry
from ..dialect import Dialect, Row, Tx
from ..errors import InvalidPayload
from ..types import DEFAULT_QUEUE, WorkerInfo


class Workers:
    dialect: Dialect

    def worker_seen(self, worker: WorkerInfo, *, starting: bool = False) -> None:
        """``worker`` is alive now (``starting``: its first beat; rows long silent go)."""
        check_worker(worker)
        queues = None if worker.queues is None else json.dumps(list(worker.queues))
        tasks = None if worker.tasks is None else json.dumps(list(worker.tasks))
        params = {"owner": worker.owner, "host": worker.host, "pid": worker.pid,
                  "started_at": worker.started_at, "beat_every": worker.beat_every,
                  "slots": worker.slots, "queues": queues, "version": worker.version,
                  "state": worker.state, "tasks": tasks}  # fmt: skip

        def seen(tx: Tx) -> None:
            if starting:
                tx.count("PRUNE_WORKERS", {"now": tx.now})
            tx.count("WORKER_SEEN", {**params, "now": tx.now})

        self.dialect.write(seen, intent="write" if starting else "statement")

    def worker_gone(self, owner: str) -> None:
        """``owner`` stopped cleanly: its row goes."""
        check_owner(owner)
        self.dialect.write(lambda tx: tx.count("WORKER_GONE", {"owner": owner}),
                           intent="statement")  # fmt: skip

    def unserved(
        self, run_ids: Sequence[int], *, tasks: Sequence[str] | None = None
    ) -> dict[int, str]:
        """B22: of ``run_ids``, the runs due now that the live pool would not claim, each with
        why ("no worker serves task X"): workers run (alive, not draining), and none of them
        serves both the run's queue and its next task. With no worker running at all, a run
        is plainly pending (the pool is down: ``status`` says so). A worker from before the
        list kept tasks serves any task. With ``tasks`` (a pool's own: its drain), judged
        against those instead of the live workers' (which may not have listed themselves
        yet)."""
        ids = sorted({int(r) for r in run_ids})
        if not ids:
            return {}

        def read(tx: Tx) -> tuple[list[Row], list[Row]]:
            return (tx.rows("LIST_WORKERS", {"now": tx.now}),
                    tx.rows("HEAD_TASKS", {"run_ids": ids, "now": tx.now}))  # fmt: skip

        listed, heads = self.dialect.read(read)
        if tasks is not None:
            own = WorkerInfo("", "", 0, 0.0, 1.0, 1, None, "", tasks=tuple(tasks))
            return {int(run_id): _why(name, version, [own]) for run_id, name, _, version in heads
                    if not serves(own, DEFAULT_QUEUE, name, version)}  # fmt: skip
        live = [w for w in map(_worker_of, listed) if w.alive and w.state == "running"]
        if not live:
            return {}
        return {int(run_id): _why(name, version, live) for run_id, name, queue, version in heads
                if not any(serves(w, queue, name, version) for w in live)}  # fmt: skip

    def workers(self) -> list[WorkerInfo]:
        """Every worker process of every host, by host and start; ``alive`` says which beat
        lately."""
        rows = self.dialect.read(lambda tx: tx.rows("LIST_WORKERS", {"now": tx.now}))
        return [_worker_of(row) for row in rows]


def serves(worker: WorkerInfo, queue: str, task: str, version: int | None = None) -> bool:
    """Whether ``worker`` claims runs of ``queue`` whose next task is ``task`` (B22) at
    ``version`` (B25; None: unversioned). A worker whose list names no version (from before
    versions) claims the task at any."""
    if worker.queues is not None and queue not in worker.queues:
        return False
    if worker.tasks is None:
        return True
    if version is None or not any(served_entry(t)[1] for t in worker.tasks):
        return task in worker.tasks
    return f"{task}@{version}" in worker.tasks


def _why(task: str, version: int | None, workers: Sequence[WorkerInfo]) -> str:
    """Why a run waits: no worker serves its task, or (B25) none serves it at its version."""
    known = any(w.tasks is None or task in w.tasks for w in workers)
    return f"no worker serves task {task}" + (
        f" version {version}" if version is not None and known else ""
    )


def check_worker(worker: WorkerInfo) -> None:
    """What every backend keeps alike: names as short text without NUL, finite positive
    numbers (a NaN period would read as never silent on one backend and fail on the other)."""
    check_owner(worker.owner)
    check_text(worker.host, "a worker's host")
    check_text(worker.version, "a worker's version")
    check_text(worker.state, "a worker's state")
    for queue in worker.queues or ():
        check_queue(queue)
    for task in worker.tasks or ():
        check_served(task)
    for what, number in (("beat_every", worker.beat_every), ("started_at", worker.started_at)):
        if not isinstance(number, (int, float)) or not math.isfinite(number) or number < 0:
            raise InvalidPayload(
                f"a worker's {what} must be a finite number from 0 (got {number!r})"
            )
    if worker.beat_every <= 0:
        raise InvalidPayload(f"a worker's beat_every must be above 0 (got {worker.beat_every!r})")
    for what, whole in (("pid", worker.pid), ("slots", worker.slots)):
        if not isinstance(whole, int) or isinstance(whole, bool) or not 0 <= whole < 2**31:
            raise InvalidPayload(f"a worker's {what} must be a whole number from 0 (got {whole!r})")


def _worker_of(row: Row) -> WorkerInfo:
    return _worker(*row)


def _worker(
    owner: str, host: str, pid: int, started: float, every: float, slots: int,
    queues: str | None, version: str, state: str, beat: float, alive: object,
    tasks: str | None = None,
) -> WorkerInfo:  # fmt: skip
    served = None if queues is None else tuple(json.loads(queues))
    return WorkerInfo(owner, host, pid, started, every, slots, served, version, state, beat,
                      bool(alive), None if tasks is None else tuple(json.loads(tasks)))  # fmt: skip
