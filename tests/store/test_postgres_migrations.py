"""PostgreSQL migrations that meet rows written before them (the steps of the shared history,
``workerproc/store/migrations.py``, as ``workerproc/store/postgres/schema.py`` runs them)."""

from __future__ import annotations

import pg_session
import psycopg
import pytest

from workerproc.store import open_store
from workerproc.store.postgres import admin


def at_version(url: str, version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setattr(admin, "SCHEMA_VERSION", version)
        m.setattr("workerproc.store.postgres.dialect.SCHEMA_VERSION", version)
        open_store(url).close()


def test_step_21_widens_the_attempt_history_check_without_scanning_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Step 21 (``started``; PostgreSQL's v15 before the shared history) lets the history say
    ``unstarted`` (B3). Its new check is added NOT VALID: the rows
    already there all passed the narrower one, and checking them would scan the history
    under the migration's ACCESS EXCLUSIVE lock. New rows are still checked."""
    url = pg_session.schema_url("mig")
    schema = url.rsplit("schema=", 1)[1]
    at_version(url, 20, monkeypatch)
    with psycopg.connect(pg_session.database_url(), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute("""INSERT INTO runs (id, state, task, queue, created_at, updated_at)
                        VALUES (1, '{}', 't', 'default', 1, 1)""")
        conn.execute("""INSERT INTO task_attempts (run_id, task_id, attempt, owner, outcome)
                        VALUES (1, 1, 1, 'w', 'taken_over')""")
        open_store(url).close()  # to the latest version
        rows = conn.execute("SELECT attempt, outcome FROM task_attempts").fetchall()
        assert rows == [(1, "taken_over")]
        (valid,) = conn.execute(
            """SELECT c.convalidated FROM pg_constraint AS c
               JOIN pg_namespace AS n ON n.oid = c.connamespace
               WHERE c.conname = 'task_attempts_outcome_check' AND n.nspname = %s""",
            (schema,),
        ).fetchone() or (None,)
        assert valid is False  # added without a scan of the rows already there
        conn.execute("""INSERT INTO task_attempts (run_id, task_id, attempt, owner, outcome)
                        VALUES (1, 1, 2, 'w', 'unstarted')""")
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("""INSERT INTO task_attempts (run_id, task_id, attempt, owner, outcome)
                            VALUES (1, 1, 3, 'w', 'bogus')""")
