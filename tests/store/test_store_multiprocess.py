"""Real races between forked processes, each with its own connection opened after fork, on every
backend.

- 8 processes claim and ack 2,000 single-task runs under a long ttl: every task is handed out
  exactly once.
- The serial-run race (R1): runs with several ready tasks, claimers that ack, release, abandon
  (a takeover follows once the lease expires) and wake up as zombies, while a sampler checks the
  database continuously: never two live leases in one run, and no claim of a task or of a run
  while another claim's lease on it was live. Claimers claim one task at a time, or in
  batches: ``commit_many`` writes their last words (done, release, hand-back, some as zombies)
  and claims up to four tasks in the same transaction, and ``renew_many`` renews them.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import time
from typing import Any

import pytest
from store_backends import Backend

from workerproc.store import CasResult, ClaimRequest, Commit, Lease

PROCS = 8
RUNS = 2_000
TTL = 3_600.0  # no lease can expire during the test: any second hand-out is a double claim


def _worker(backend: Backend, k: int, barrier: Any, out_dir: str) -> None:
    store = backend.open()  # opened in the child, after fork
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
def test_eight_processes_hand_out_every_task_exactly_once(backend: Backend, tmp_path: Any) -> None:
    store = backend.open()
    runs = {store.start_run("single", {"i": i}) for i in range(RUNS)}
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(PROCS)
    procs = [
        ctx.Process(target=_worker, args=(backend, k, barrier, str(tmp_path))) for k in range(PROCS)
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


# -- the serial-run race -------------------------------------------------------------------------
SERIAL_RUNS, TASKS_PER_RUN, CLAIMERS = 30, 3, 6
SHORT_TTL = 0.3
RACE_SECONDS = 20.0  # an upper bound: the claimers stop as soon as every run is done


def _claimer(backend: Backend, k: int, barrier: Any, out_dir: str, seed: int) -> None:
    """Claim and then ack, release, abandon (let the lease expire) or act as a zombie (sleep
    past the ttl, then try to ack: refused). Record every claim with the database's times and
    a lower bound of when its lease ended (``store.now()`` read before the ack or release)."""
    rnd = random.Random(seed + k)
    store = backend.open()
    owner = f"claimer-{k}"
    log: list[dict[str, Any]] = []
    barrier.wait(30)
    deadline = time.monotonic() + RACE_SECONDS
    while time.monotonic() < deadline:
        lease = store.claim(owner, SHORT_TTL, max_attempts=1_000)
        if lease is None:
            if store.next_ready_at() is None:
                break  # every run is done
            time.sleep(0.01)
            continue
        entry = _entry(lease)
        action = rnd.choices(["ack", "release", "abandon", "zombie"], [5, 2, 2, 1])[0]
        if action == "zombie":
            time.sleep(SHORT_TTL * 1.5)
            entry["zombie_acked"] = store.ack(lease)  # must be refused: the lease expired
        elif action in ("ack", "release"):
            entry["ended"] = store.now()  # the ack/release lands after this instant
            ok = store.ack(lease) if action == "ack" else store.release(lease)
            entry["ok"] = ok
        log.append(entry)
    store.close()
    with open(os.path.join(out_dir, f"c{k}.json"), "w") as f:
        json.dump(log, f)


def _entry(lease: Lease) -> dict[str, Any]:
    return {"run": lease.run_id, "task": lease.task_id, "attempt": lease.attempt,
            "claimed": lease.claimed_at, "expires": lease.expires_at, "ended": None}  # fmt: skip


def _batch_claimer(backend: Backend, k: int, barrier: Any, out_dir: str, seed: int) -> None:
    """The same race with batches: each turn commits the last words of the previous turn's
    leases (finish, done, release or hand-back; some after sleeping past the ttl, as zombies) and
    claims up to four tasks in one transaction; some leases are renewed together, some
    abandoned (they expire and are taken over)."""
    rnd = random.Random(seed + k)
    store = backend.open()
    owner = f"batcher-{k}"
    log: list[dict[str, Any]] = []
    pending: list[tuple[Commit, dict[str, Any]]] = []
    barrier.wait(30)
    deadline = time.monotonic() + RACE_SECONDS
    while time.monotonic() < deadline:
        zombie = pending and rnd.random() < 0.1
        if zombie:
            time.sleep(SHORT_TTL * 1.5)  # every lease of the batch expired meanwhile
        request = ClaimRequest(owner, SHORT_TTL, 1_000, rnd.randint(1, 4))
        ended = store.now()  # the commits land after this instant
        out = store.commit_many([commit for commit, _ in pending], claim=request)
        for (_, entry), result in zip(pending, out.results, strict=True):
            entry["ended"], entry["ok"] = ended, result is CasResult.OK
            if zombie:
                entry["zombie_acked"] = result is CasResult.OK  # must be refused
        pending = []
        if not out.leases:
            if store.next_ready_at() is None:
                break  # every run is done
            time.sleep(0.01)
            continue
        if rnd.random() < 0.3:
            renewed = store.renew_many(list(out.leases), SHORT_TTL)
            after = store.now()  # a lease still live when renewed is never refused (a loaded
            for lease, at in zip(out.leases, renewed, strict=True):  # machine may outwait one)
                assert at is not None or after >= lease.expires_at, (lease, after)
        for lease in out.leases:
            entry = _entry(lease)
            action = rnd.choices(
                ["finish", "drop", "release", "handback", "abandon"], [1, 3, 3, 1, 2]
            )[0]
            if action != "abandon":  # a batch of one-statement kinds goes as one completion each
                commit = Commit(lease, action, expected_revision=lease.revision)  # type: ignore[arg-type]
                pending.append((commit, entry))
            log.append(entry)
    store.close()
    with open(os.path.join(out_dir, f"c{k}.json"), "w") as f:
        json.dump(log, f)


def _sampler(backend: Backend, stop: Any, out_dir: str) -> None:
    """Check the database over and over while the claimers race: two live leases in one run."""
    store = backend.open()
    samples, found = 0, []
    while not stop.is_set():
        found += [v for v in store.integrity_violations() if v not in found]
        samples += 1
    store.close()
    with open(os.path.join(out_dir, "sampler.json"), "w") as f:
        json.dump({"samples": samples, "violations": found}, f)


def _overlaps(claims: list[dict[str, Any]]) -> list[str]:
    """Claims (of one task, or of one run) whose start fell inside an earlier claim's lease."""
    bad = []
    ordered = sorted(claims, key=lambda c: (c["claimed"], c["attempt"]))
    for i, later in enumerate(ordered):
        for earlier in ordered[:i]:
            end = earlier["expires"]
            if earlier["ended"] is not None and earlier.get("ok"):
                end = min(end, earlier["ended"])
            if later["claimed"] < end:
                bad.append(f"{later} claimed while {earlier} was live")
    return bad


@pytest.mark.slow
@pytest.mark.parametrize("batches", [False, True], ids=["one-by-one", "batches"])
def test_serial_runs_never_hold_two_live_leases_under_racing_claimers(
    backend: Backend, tmp_path: Any, batches: bool
) -> None:
    store = backend.open()
    for i in range(SERIAL_RUNS):
        run_id = store.start_run("first", {"i": i})
        now = store.now()
        for j in range(1, TASKS_PER_RUN):  # more ready tasks in the same run, ready at once
            backend.add_task(run_id, f"more{j}", now - j, now - j)
    ctx = multiprocessing.get_context("fork")
    barrier, stop = ctx.Barrier(CLAIMERS), ctx.Event()
    sampler = ctx.Process(target=_sampler, args=(backend, stop, str(tmp_path)))
    sampler.start()
    target = _batch_claimer if batches else _claimer
    claimers = [
        ctx.Process(target=target, args=(backend, k, barrier, str(tmp_path), 42))
        for k in range(CLAIMERS)
    ]
    for p in claimers:
        p.start()
    for p in claimers:
        p.join(RACE_SECONDS + 60)
    stop.set()
    sampler.join(60)
    assert [p.exitcode for p in claimers] == [0] * CLAIMERS
    assert sampler.exitcode == 0

    with open(tmp_path / "sampler.json") as f:
        sampled = json.load(f)
    assert sampled["samples"] > 10 and sampled["violations"] == []
    claims = []
    for k in range(CLAIMERS):
        with open(tmp_path / f"c{k}.json") as f:
            claims += json.load(f)
    by_task: dict[int, list[dict[str, Any]]] = {}
    by_run: dict[int, list[dict[str, Any]]] = {}
    for c in claims:
        by_task.setdefault(c["task"], []).append(c)
        by_run.setdefault(c["run"], []).append(c)
    assert all(not c["zombie_acked"] for c in claims if "zombie_acked" in c)
    for task_claims in by_task.values():
        attempts = sorted(c["attempt"] for c in task_claims)
        assert attempts == list(range(1, len(attempts) + 1)), "an attempt was handed out twice"
    problems = [p for group in by_run.values() for p in _overlaps(group)]
    assert problems == []
    takeovers = sum(1 for c in claims if c["attempt"] > 1)
    assert takeovers > 0 and len(by_run) == SERIAL_RUNS  # the race really had takeovers
    assert store.integrity_violations() == []
    store.close()
