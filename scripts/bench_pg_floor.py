"""scripts/bench's PostgreSQL floor for idle pickup (not a test): what the server and this machine
cost before any of our code runs. A bare psycopg producer commits ``INSERT`` + ``NOTIFY`` in one
transaction after the same idle gaps as our pickup row; a bare listener process, asleep in
``select()`` on a ``LISTEN`` connection, claims the row with one ``UPDATE … FOR UPDATE SKIP
LOCKED`` on a second connection (as a worker's claim loop and listener are two connections) and
stamps the time. Our pickup (``bench_pg.pickup``) does the same chain through ``start_run``, the
worker's idle loop and a handler that stamps its start, so the two rows can be compared.

    scripts/bench pg-floor URL [SAMPLES]   # alone, in a schema of its own, then dropped
"""

from __future__ import annotations

import argparse
import multiprocessing
import secrets
import select
import statistics
import time
from multiprocessing.queues import Queue

import psycopg
from psycopg import sql

CLAIM = (
    "UPDATE {t} SET owner = 'floor' WHERE id = (SELECT id FROM {t} WHERE owner IS NULL "
    "ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id"
)


def _listener(url: str, table: str, channel: str, out: Queue[float | str]) -> None:
    listen = psycopg.connect(url, autocommit=True)  # opened after fork: nothing crosses it
    claim = psycopg.connect(url, autocommit=True)
    listen.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    statement = sql.SQL(CLAIM).format(t=sql.Identifier(table))
    out.put("up")
    while True:
        select.select([listen.fileno()], [], [], 5.0)
        if not list(listen.notifies(timeout=0, stop_after=1)):
            continue
        if claim.execute(statement).fetchone() is not None:
            out.put(time.time())


def raw_pickup(url: str, gaps: list[float]) -> tuple[list[float], list[float]]:
    """(enqueue commit ms, pickup ms) per gap: from just before the producer's transaction to
    its commit, and to the listener's claim."""
    tag = secrets.token_hex(3)
    table, channel = f"pickup_floor_{tag}", f"floor_{tag}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE TABLE {} (id bigserial PRIMARY KEY, owner text)").format(
                sql.Identifier(table)
            )
        )
    ctx = multiprocessing.get_context("fork")
    out: Queue[float | str] = ctx.Queue()
    proc = ctx.Process(target=_listener, args=(url, table, channel, out), daemon=True)
    proc.start()
    commits: list[float] = []
    pickups: list[float] = []
    try:
        if out.get(timeout=30) != "up":
            raise SystemExit("the floor's listener did not start")
        insert = sql.SQL("INSERT INTO {} (owner) VALUES (NULL)").format(sql.Identifier(table))
        notify = sql.SQL("NOTIFY {}").format(sql.Identifier(channel))
        with psycopg.connect(url) as producer:
            time.sleep(3)  # the same settling as our pickup row
            for gap in gaps:
                time.sleep(gap)
                t0 = time.time()
                with producer.transaction():
                    producer.execute(insert)
                    producer.execute(notify)
                commits.append((time.time() - t0) * 1000)
                stamp = out.get(timeout=30)
                assert isinstance(stamp, float)
                pickups.append((stamp - t0) * 1000)
    finally:
        proc.kill()
        proc.join(10)
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
    return commits, pickups


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of ``scripts/bench pg-floor``."""
    ap.add_argument(
        "url",
        nargs="?",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="a PostgreSQL database to work in (a table of its own, dropped after)",
    )
    ap.add_argument("samples", nargs="?", type=int, default=30, help="pickups timed")


def run(args: argparse.Namespace) -> int:
    import random  # noqa: PLC0415 - only for the stand-alone run

    rng = random.Random(7)
    commits, pickups = raw_pickup(args.url, [rng.uniform(0.2, 2.0) for _ in range(args.samples)])
    print(
        f"raw floor, {args.samples} samples: enqueue commit p50 {statistics.median(commits):.1f} "
        f"ms; pickup p50 {statistics.median(pickups):.1f} ms, max {max(pickups):.1f} ms"
    )
    return 0
