"""What the walk that finds the claim's floor reads while vacuum is blocked (not a test): on a
private PostgreSQL (as root: tests/support/pg_private.py), another client holds a transaction
id open while runs of ``default`` are started and ended, ``DEAD`` at a time; at each size, the
buffers and index entries of a walk from the oldest end (the walk before the sweep) beside the
store's own walks (``floors.floor``: up from its floor, and one piece of the sweep below it),
each walk's entries read over two rounds of the sweep. The runs are ended faster than 200 a
second, and the walks wait until the floor (``LAG`` behind now) has passed them.

    scripts/measure_floor_walk.py [--sizes 2000,20000,60000,120000]
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "support")]

import pg_private  # noqa: E402 - the tests' private server
import psycopg  # noqa: E402

from workerproc.store import Commit, open_store  # noqa: E402
from workerproc.store.postgres import floors  # noqa: E402
from workerproc.store.postgres import sql as postgres_sql  # noqa: E402
from workerproc.store.postgres.tx import PostgresTx  # noqa: E402
from workerproc.store.types import ClaimRequest  # noqa: E402

SCOPE = ("default",)


def end_runs(store: Any, n: int) -> None:
    for _ in range(n // 500):
        for _ in range(25):  # heads 20 a batch, as a producer at 200 runs/s writes them
            store.start_runs([{"task": "noop"}] * 20)
        leases = store.claim("w", 60, queues=list(SCOPE), limit=100)
        while leases:
            again = ClaimRequest("w", 60.0, queues=SCOPE, limit=100)
            out = store.commit_many([Commit(lease, "finish") for lease in leases], claim=again)
            leases = list(out.leases)


def explain(conn: psycopg.Connection[Any], lo: float, hi: float, lag: float | None,
            sql: str = floors.FLOOR_NAMED) -> str:  # fmt: skip
    params = {"now": None, "lag": lag, "lo": lo, "hi": hi, "queues": list(SCOPE), "floor": lo,
              "owner": "w", "ttl": 60.0, "start": True}  # fmt: skip
    with conn.transaction(force_rollback=True):
        for setting in ("enable_seqscan", "enable_bitmapscan", "jit"):
            conn.execute(f"SET LOCAL {setting} = off")
        levels = conn.execute(floors.LEVELS, {"lo": -math.inf}).fetchone()
        params["levels"] = levels[0] if levels is not None else []
        plan = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {sql}", params)
        text = "\n".join(row[0] for row in plan.fetchall())
    if "--plans" in sys.argv:
        print(text)
    hits = sum(int(n) for n in re.findall(r"shared hit=(\d+)", text.split("Planning")[0])[:1])
    ms = re.search(r"Execution Time: ([\d.]+)", text)
    return f"{hits} buffers, {ms.group(1) if ms else '?'} ms"


def walks(conn: psycopg.Connection[Any], n: int) -> list[tuple[int, float]]:
    out = []
    for _ in range(n):
        with conn.transaction(), conn.cursor() as cur:
            tx = PostgresTx(cur, None)
            before = tx.execute(floors.READ, {}).fetchone()
            t0 = time.perf_counter()
            floors.floor(tx, SCOPE)
            ms = (time.perf_counter() - t0) * 1000
            after = tx.execute(floors.READ, {}).fetchone()
        assert before is not None and after is not None
        out.append((int(after[0]) - int(before[0]), ms))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2000,20000,60000,120000")
    ap.add_argument("--plans", action="store_true", help="print each EXPLAIN")
    args = ap.parse_args()
    floors.WALK_EVERY = 0.0  # each call walks
    with pg_private.private_server() as pg:
        url = f"{pg.url()}?schema=lk_walk"
        store = open_store(url)
        walker = psycopg.connect(pg.url(), autocommit=True)
        walker.execute("SET search_path = lk_walk")
        walks(walker, 1)  # the connection's first walk, before anything died
        holder = psycopg.connect(pg.url())
        holder.execute("SELECT txid_current()")  # idle in transaction: the horizon is held
        dead = 0
        print("| dead entries | walk from the oldest end | the store's walk: up from its floor "
              "| a piece | entries a walk reads (median / max over two rounds) "
              "| the claim from the floor |")  # fmt: skip
        print("| ---: | --- | --- | --- | --- | --- |")
        for size in (int(s) for s in args.sizes.split(",")):
            end_runs(store, size - dead)
            dead = size
            live = store.start_run("noop")
            walks(walker, 3)  # up to the live run (or now less the lag)
            time.sleep(floors.LAG + 1)  # nothing dies meanwhile: the floor moves past them all
            walks(walker, 3)
            known = floors._FLOORS[walker][SCOPE]  # what the next walk reads
            old = explain(walker, -math.inf, math.inf, floors.LAG)
            up = explain(walker, known.at, math.inf, floors.LAG)
            piece = known.sweep.bounds(known.at) or (-math.inf, known.sweep.base)
            part = explain(walker, piece[0], piece[1], None)
            claim = explain(walker, known.at, math.inf, None, postgres_sql.claim_sql(1, 1))
            rounds = walks(walker, 2 * (len(known.sweep.read) + 1))
            reads = [n for n, _ in rounds]
            print(f"| {size:,} | {old} | {up} | {part} | {statistics.median(reads):,.0f} / "
                  f"{max(reads):,} ({len(known.sweep.read)} pieces, walk p50 "
                  f"{statistics.median(ms for _, ms in rounds):.2f} ms, max "
                  f"{max(ms for _, ms in rounds):.2f}) | {claim} |")  # fmt: skip
            lease = store.claim("w", 60, queues=list(SCOPE))
            if lease is not None and lease.run_id == live:
                store.commit_many([Commit(lease, "finish")])
        holder.close()
        walker.close()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
