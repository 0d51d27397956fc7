"""procrastinate's side of scripts/bench's PostgreSQL rows: the same no-op workload as ours, on
the same server, in its own schema (``LK_PROCRASTINATE_URL`` names the database, with
``options=-csearch_path=...``)."""

from __future__ import annotations

import os
import time

import procrastinate

app = procrastinate.App(
    connector=procrastinate.SyncPsycopgConnector(conninfo=os.environ["LK_PROCRASTINATE_URL"])
)
worker_app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ["LK_PROCRASTINATE_URL"])
)


@worker_app.task(name="noop")
def noop() -> None:
    return None


@worker_app.task(name="stamp")
def stamp() -> float:
    return time.time()
