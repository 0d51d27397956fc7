"""The production checklist's monitoring queries (docs/how-to/postgresql.md) run as written on a
fresh schema with work in it, and say what the store says: the ready backlog, the live leases,
the hot tables' row counts."""

from __future__ import annotations

import re

import pg_session
import psycopg
import pytest
from docs_blocks import ROOT

from workerproc.store import open_store

pytestmark = pytest.mark.postgres

PAGE = ROOT / "docs" / "how-to" / "postgresql.md"


def queries() -> list[str]:
    """The checklist's SQL block, one statement each (its comments dropped)."""
    text = PAGE.read_text(encoding="utf-8")
    block = re.search(r"tests/store/test_monitoring_queries\.py[^\n]*\n```sql\n(.*?)^```", text,
                      re.MULTILINE | re.DOTALL)  # fmt: skip
    assert block is not None, "the checklist's monitoring block is gone"
    body = "\n".join(line for line in block[1].splitlines() if not line.startswith("--"))
    return [q.strip() for q in body.split(";") if q.strip()]


def test_the_checklists_monitoring_queries_run_and_agree_with_the_store() -> None:
    url = pg_session.schema_url("mon")
    schema = url.rsplit("schema=", 1)[1]
    with open_store(url) as store:
        store.start_runs([{"task": "step", "payload": {}}] * 3)
        held = store.claim("w1", 60)
        assert held is not None
        found = []
        with psycopg.connect(pg_session.database_url(), autocommit=True) as conn:
            for query in queries():
                found.append(conn.execute(query.replace("leasekeeper.", f"{schema}.").replace(
                    "'leasekeeper'", f"'{schema}'")).fetchall())  # fmt: skip
    ready, leases, tables, _ = found
    assert ready[0][0] == 2  # three runs, one leased
    assert leases[0] == (1, 0)
    assert {row[0] for row in tables} == {"runs", "tasks", "leases", "events"}
