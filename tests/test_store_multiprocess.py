"""A real race: 8 forked processes, each with its own connection opened after fork, claim and
ack 2,000 single-task runs under a long ttl. Every task must be handed out exactly once."""

from __future__ import annotations

import json
import multiprocessing
import os
from typing import Any

import pytest

from workerproc.store import open_store

PROCS = 8
RUNS = 2_000
TTL = 3_600.0  # no lease can expire during the test: any second hand-out is a double claim


def _worker(url: str, k: int, barrier: Any, out_dir: str) -> None:
    store = open_store(url)  # opened in the child, after fork
    got: list[tuple[int, int, int]] = []
    barrier.wait(30)
    while (lease := store.claim(f"proc-{k}", TTL)) is not None:
        if not store.ack(lease):
            raise AssertionError(f"ack of a fresh lease failed: {lease}")
        got.append((lease.task_id, lease.attempt, lease.run_id))
    store.close()
    with open(os.path.join(out_dir, f"{k}.json"), "w") as f:
        json.dump(got, f)


@pytest.mark.slow
def test_eight_processes_hand_out_every_task_exactly_once(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/race.db"
    store = open_store(url)
    runs = {store.start_run("single", {"i": i}) for i in range(RUNS)}
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(PROCS)
    procs = [
        ctx.Process(target=_worker, args=(url, k, barrier, str(tmp_path))) for k in range(PROCS)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * PROCS

    per_proc = []
    for k in range(PROCS):
        with open(tmp_path / f"{k}.json") as f:
            per_proc.append([tuple(x) for x in json.load(f)])
    handed = [x for part in per_proc for x in part]
    task_ids = [task_id for task_id, _, _ in handed]
    assert len(task_ids) == len(set(task_ids)), "a task was handed out twice"
    assert {run_id for _, _, run_id in handed} == runs  # all 2,000 covered
    assert {attempt for _, attempt, _ in handed} == {1}
    stats = store.stats()
    assert stats.runs == {"succeeded": RUNS} and stats.pending_work == 0
    store.close()
