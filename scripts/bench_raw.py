"""scripts/bench's ceilings: bare SQLite loops with no framework around them, fenced by owner
like ours. ``k = 1``: each write transaction completes the previous task and claims the next
(the one-transaction ceiling). ``k > 1``: each completes the previous k tasks and claims k new
ones (the batched ceiling: what batched claims and commits can reach at most)."""

from __future__ import annotations

import os
import sqlite3
import time
from multiprocessing import get_context

CLAIM_ONE = (
    "UPDATE q SET owner = ?, expires = ?, attempts = attempts + 1 WHERE id = "
    "(SELECT id FROM q WHERE done = 0 AND owner IS NULL ORDER BY id LIMIT 1) RETURNING id"
)
CLAIM_MANY = (
    "UPDATE q SET owner = ?, expires = ?, attempts = attempts + 1 WHERE id IN "
    "(SELECT id FROM q WHERE done = 0 AND owner IS NULL ORDER BY id LIMIT ?) RETURNING id"
)
COMPLETE = "UPDATE q SET done = 1, owner = NULL WHERE id = ? AND owner = ?"


def _raw_worker(args: tuple[str, str, int]) -> int:
    db, sync, me = args
    c = sqlite3.connect(db, isolation_level=None, timeout=30)
    c.execute(f"PRAGMA synchronous={sync}")
    prev, n = None, 0
    while True:
        c.execute("BEGIN IMMEDIATE")
        if prev is not None:
            c.execute(COMPLETE, (prev, me))
        row = c.execute(CLAIM_ONE, (me, time.time() + 60)).fetchone()
        c.execute("COMMIT")
        if row is None:
            return n
        prev, n = row[0], n + 1


def _raw_batched_worker(args: tuple[str, str, int, int]) -> int:
    db, sync, me, k = args
    c = sqlite3.connect(db, isolation_level=None, timeout=30)
    c.execute(f"PRAGMA synchronous={sync}")
    prev: list[int] = []
    n = 0
    while True:
        c.execute("BEGIN IMMEDIATE")
        if prev:
            cur = c.executemany(COMPLETE, [(i, me) for i in prev])
            assert cur.rowcount == len(prev), "a fenced completion was refused"
        rows = c.execute(CLAIM_MANY, (me, time.time() + 60, k)).fetchall()
        c.execute("COMMIT")
        if not rows:
            return n
        prev = [r[0] for r in rows]
        n += len(prev)


def raw(tmp: str, m: int, w: int, sync: str = "FULL", k: int = 1) -> float:
    """Tasks/s of ``w`` processes draining ``m`` tasks, ``k`` per write transaction."""
    db = os.path.join(tmp, f"raw-{w}-{k}-{time.monotonic_ns()}.db")
    c = sqlite3.connect(db, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("CREATE TABLE q (id INTEGER PRIMARY KEY, owner INTEGER, expires REAL,"
              " done INTEGER NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0)")  # fmt: skip
    c.execute("CREATE INDEX q_ready ON q (done, id)")
    c.execute("BEGIN")
    c.executemany("INSERT INTO q (id) VALUES (?)", ((i,) for i in range(1, m + 1)))
    c.execute("COMMIT")
    c.close()
    started = time.monotonic()
    with get_context("fork").Pool(w) as pool:
        if k == 1:
            done = sum(pool.map(_raw_worker, [(db, sync, i) for i in range(w)]))
        else:
            done = sum(pool.map(_raw_batched_worker, [(db, sync, i, k) for i in range(w)]))
    elapsed = time.monotonic() - started
    c = sqlite3.connect(db)
    left = c.execute("SELECT count(*) FROM q WHERE done = 0 OR attempts != 1").fetchone()[0]
    c.close()
    assert done == m and left == 0, (done, m, left)
    return m / elapsed
