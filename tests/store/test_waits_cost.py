"""100,000 waiting runs cost no claim time: on SQLite, the claim's virtual machine
steps (counted by a progress handler, so the figure is exact, not a timing) beside 100,000 runs
that wait for a signal are within 10 % of the same claim beside none. The waiting runs are made
by the wait commit itself for the first ones and copied row for row for the rest."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from workerproc.store import CasResult, Commit, Store, open_store
from workerproc.store.codec import WAIT_FOREVER

WAITING, READY = 100_000, 200


def make_waiting(store: Store, n: int) -> None:
    """``n`` runs waiting for signal ``go``, each made by a real wait commit (claimed in
    batches, committed together)."""
    store.start_runs([{"task": "draft"}] * n)
    while leases := store.claim("maker", 60, limit=500):
        commits = [Commit(x, "wait", expected_revision=x.revision, new_state={},
                          next_task="after", delay=WAIT_FOREVER, wait_for="signal:go")
                   for x in leases]  # fmt: skip
        assert set(store.commit_many(commits).results) == {CasResult.OK}


def copy_waiting(path: str, n: int) -> None:
    """Copy the first waiting run and its tasks ``n`` times, row for row (the head triggers
    run on each insert, as on the wait commit's)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    (template,) = conn.execute("SELECT min(id) FROM runs WHERE wait_for IS NOT NULL").fetchone()
    top = conn.execute("SELECT max(id) FROM runs").fetchone()[0]
    conn.execute(
        """WITH RECURSIVE g(value) AS (SELECT 1 UNION ALL SELECT value + 1 FROM g WHERE value < :n)
           INSERT INTO runs (id, state, task, queue, priority, created_at, updated_at, wait_for,
               wait_until)
           SELECT :top + g.value, r.state, r.task, r.queue, r.priority, r.created_at,
               r.updated_at, r.wait_for, r.wait_until
           FROM runs AS r, g WHERE r.id = :template""",
        {"top": top, "n": n, "template": template},
    )
    conn.execute(
        """WITH RECURSIVE g(value) AS (SELECT 1 UNION ALL SELECT value + 1 FROM g WHERE value < :n)
           INSERT INTO tasks (run_id, name, payload, available_at, created_at, attempts,
               done_at, done_attempt, done_owner)
           SELECT :top + g.value, t.name, t.payload, t.available_at, t.created_at, t.attempts,
               t.done_at, t.done_attempt, t.done_owner
           FROM tasks AS t, g WHERE t.run_id = :template
           ORDER BY g.value, t.id""",
        {"top": top, "n": n, "template": template},
    )
    conn.execute("""UPDATE runs SET wait_task = (SELECT max(id) FROM tasks WHERE run_id = runs.id)
                    WHERE id > :top""", {"top": top})  # fmt: skip
    conn.execute("COMMIT")
    conn.close()


def claim_steps(path: str, claims: int = 20) -> int:
    """VM steps of ``claims`` claims of one ready task each (each lease given back)."""
    store = open_store(path)
    conn = store.dialect._conn()  # type: ignore[attr-defined]
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    total = 0
    for i in range(claims):
        conn.set_progress_handler(count, 1)
        lease = store.claim(f"w{i}", 60)
        conn.set_progress_handler(None, 1)
        assert lease is not None and lease.task == "ready"
        store.commit_many([Commit(lease, "handback")])
        total, steps[0] = total + steps[0], 0
    store.close()
    return total


def test_a_hundred_thousand_waiting_runs_cost_the_claim_nothing(tmp_path: Path) -> None:
    plain, busy = str(tmp_path / "plain.db"), str(tmp_path / "waiting.db")
    for path in (plain, busy):
        with open_store(path) as store:
            if path == busy:
                make_waiting(store, 100)
            store.start_runs([{"task": "ready"}] * READY)
    copy_waiting(busy, WAITING - 100)
    with open_store(busy) as store:
        assert store.stats().runs.get("waiting") == WAITING
        assert len(store.list_runs(status="waiting", limit=5)) == 5
    without, beside = claim_steps(plain), claim_steps(busy)
    print(f"20 claims: {without} VM steps beside no waiting run, {beside} beside {WAITING:,}")
    assert beside <= without * 1.10, (without, beside)
