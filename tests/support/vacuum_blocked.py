"""A database that cannot vacuum: a pool under a steady stream of runs while another client holds
a transaction open (``idle in transaction``, with a transaction id: a forgotten ``BEGIN`` that
wrote), so no dead row of the queue tables can be removed; then the transaction ends.

On a private PostgreSQL (pg_private.py: holding the horizon back on a shared server would stop
everyone's vacuum). A supervisor serves the ``default`` queue; a producer starts ``rate`` no-op
runs a second there; a probe starts one run a tick in a queue of its own and claims it, timing
the claim (the claim walks the same indexes and skips the same dead rows). Every ``WINDOW``
seconds: the probe's claim p50/p99, the ready depth of ``default``, the dead rows and size of
``runs`` and ``tasks``. Phases: ``clean`` (before), ``blocked`` (the transaction open),
``recovery`` (after it ended, until the claim p99 is back within ``RECOVERED`` x its clean value
and the ready queue is down to ``BACKLOG_S`` seconds of arrivals, or ``recovery_s``).

Used by tests/chaos/test_vacuum_blocked.py (a short block) and ``scripts/soak --pressure`` (20
minutes).
"""

from __future__ import annotations

import math
import secrets
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pg_private
import psycopg
from sv_harness import Supervisor

from workerproc.store import open_store

WINDOW = 10.0
PROBE_EVERY = 0.05
RECOVERED = 1.5  # the recovery is over once a window's claim p99 is within this of clean ...
BACKLOG_S = 5.0  # ... and the ready queue holds no more than this many seconds of arrivals
FLOOR_MS = 20.0  # a clean p99 below this counts as this: a loaded 2-core machine's noise
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"  # benchapp: the no-op handlers


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Probe(threading.Thread):
    """One run a tick in queue ``probe`` (served by no worker), claimed and acked here."""

    def __init__(self, url: str) -> None:
        super().__init__(name="probe", daemon=True)
        self.url = url
        self.samples: list[tuple[float, float]] = []  # (monotonic, claim ms)
        self.stop = threading.Event()

    def run(self) -> None:
        with open_store(self.url) as store:
            while not self.stop.wait(PROBE_EVERY):
                store.start_run("noop", queue="probe")
                t0 = time.perf_counter()
                lease = store.claim("probe", 60, queues=["probe"])
                ms = (time.perf_counter() - t0) * 1000
                if lease is not None:
                    store.ack(lease)
                self.samples.append((time.monotonic(), ms))


class Producer(threading.Thread):
    def __init__(self, url: str, rate: float) -> None:
        super().__init__(name="producer", daemon=True)
        self.url, self.rate = url, rate
        self.started = 0
        self.stop = threading.Event()

    def run(self) -> None:
        tick = 0.1
        with open_store(self.url) as store:
            due = time.monotonic()
            while not self.stop.is_set():
                due += tick
                n = max(1, round(self.rate * tick))
                store.start_runs([{"task": "noop"}] * n)
                self.started += n
                self.stop.wait(max(0.0, due - time.monotonic()))


def _tables(conn: psycopg.Connection[Any], schema: str) -> dict[str, Any]:
    rows = conn.execute(
        "SELECT relname, n_dead_tup, n_live_tup, pg_total_relation_size(relid), "
        "autovacuum_count FROM pg_stat_user_tables WHERE schemaname = %s "
        "AND relname IN ('runs', 'tasks', 'leases')", (schema,),
    ).fetchall()  # fmt: skip
    ready = conn.execute(
        f"SELECT count(*) FROM {schema}.runs WHERE queue = 'default' AND status = 'pending'"
    ).fetchone()
    held = conn.execute(
        "SELECT max(age(backend_xmin)) FROM pg_stat_activity WHERE backend_xmin IS NOT NULL"
    ).fetchone()
    # how far the oldest snapshot lags: transactions vacuum cannot look past
    out: dict[str, Any] = {
        "depth": ready[0] if ready else None,
        "horizon_age": held[0] if held else None,
    }
    for name, dead, live, size, autovacuums in rows:
        out[name] = {"dead": dead, "live": live, "mb": round(size / 2**20, 1),
                     "autovacuums": autovacuums}  # fmt: skip
    return out


def _window(probe: Probe, since: float, conn: psycopg.Connection[Any], schema: str,
            phase: str, began: float) -> dict[str, Any]:  # fmt: skip
    ms = [m for t, m in probe.samples if t >= since]
    doc: dict[str, Any] = {"phase": phase, "t": round(time.monotonic() - began), "claims": len(ms)}
    if ms:
        doc["p50"], doc["p99"] = round(statistics.median(ms), 2), round(_pct(ms, 0.99), 2)
    doc.update(_tables(conn, schema))
    return doc


def soak(work: Path, *, clean_s: float, blocked_s: float, recovery_s: float, rate: float = 200.0,
         workers: int = 2, say: Callable[[str], None] = lambda _: None,
         settings: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    """Run it (``settings``: the server's, ``name=value``); returns the windows and the
    summary figures."""
    schema = f"lk_vac_{secrets.token_hex(4)}"
    with pg_private.private_server(settings=settings) as pg:
        url = f"{pg.url()}?schema={schema}"
        with open_store(url):
            pass
        sv = Supervisor(work, "vac")
        sv.db, sv.extra_path = url, str(SCRIPTS)
        windows: list[dict[str, Any]] = []
        probe, producer = Probe(url), Producer(url, rate)
        blocker = psycopg.connect(pg.url(), autocommit=False)
        try:
            sv.start("--queues", "default", n=workers, app="benchapp:app")
            sv.wait_workers(workers, timeout=60)
            producer.start()
            probe.start()
            began = time.monotonic()
            with psycopg.connect(pg.url(), autocommit=True) as conn:

                def phase(name: str, seconds: float, done: Callable[[], bool] = lambda: False
                          ) -> None:  # fmt: skip
                    end = time.monotonic() + seconds
                    while time.monotonic() < end:
                        since = time.monotonic()
                        time.sleep(min(WINDOW, max(0.0, end - since)))
                        windows.append(_window(probe, since, conn, schema, name, began))
                        say(str(windows[-1]))
                        if done():
                            return

                phase("clean", clean_s)
                blocker.execute("SELECT txid_current()")  # holds the horizon: idle in transaction
                phase("blocked", blocked_s)
                blocker.rollback()
                clean = _summary(windows, "clean")
                phase("recovery", recovery_s, lambda: _recovered(windows[-1], clean, rate))
        finally:
            producer.stop.set()
            probe.stop.set()
            blocker.close()
            sv.kill_all()
        producer.join(30)
        probe.join(30)
    return {"rate": rate, "started": producer.started, "windows": windows,
            **{p: _summary(windows, p) for p in ("clean", "blocked", "recovery")}}  # fmt: skip


def _recovered(window: dict[str, Any], clean: dict[str, Any], rate: float) -> bool:
    """Back to the clean figures: the claim's p99, and the backlog drained (a few seconds of
    arrivals at most)."""
    p99_back = window.get("p99", math.inf) <= RECOVERED * max(clean["p99"], FLOOR_MS)
    return p99_back and (window["depth"] or 0) <= BACKLOG_S * rate


def _summary(windows: list[dict[str, Any]], phase: str) -> dict[str, Any]:
    """A phase's worst window: its claim p99, its deepest queue, the most dead rows; and for the
    recovery, how long until its p99 came back."""
    mine = [w for w in windows if w["phase"] == phase and "p99" in w]
    if not mine:
        return {}
    out = {
        "p99": max(w["p99"] for w in mine),
        "p50": round(statistics.median(w["p50"] for w in mine), 2),
        "depth": max(w["depth"] or 0 for w in mine),
        "dead_runs": max(w.get("runs", {}).get("dead", 0) for w in mine),
        "dead_tasks": max(w.get("tasks", {}).get("dead", 0) for w in mine),
        "horizon_age": max(w.get("horizon_age") or 0 for w in mine),
        "last_p99": mine[-1]["p99"],
        "last_depth": mine[-1]["depth"],
        "seconds": mine[-1]["t"] - mine[0]["t"] + WINDOW,
    }
    return out
