"""The SQLite backend's operators (cancel, retry, prune), finished-run totals and worker list,
each statement named with its one-line purpose (claims and commits are in ``sql``), as
PostgreSQL's ``ops_sql``. An operator reads the run first (``RUN_STATUS``), then writes its
tasks.

Its queries are in ``queries/ops.sql``, each named and described there (loaded and
checked when this module is imported).
"""

from __future__ import annotations

from ..queries import load, texts

# (steps' parts: RETRY_TASKS is both)
_PARTS = ("RETRY_TASKS_DUE", "RETRY_LEASE_DROPPED")
QUERIES = load("workerproc.store.sqlite", "ops.sql", style="named", internal=_PARTS)
globals().update(texts(QUERIES))


def __getattr__(name: str) -> str:  # the queries above, by name (for the type checker)
    raise AttributeError(f"no query {name} in {__name__}")
