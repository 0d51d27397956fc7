"""PostgreSQL's statements for runs that wait (docs/protocol.md B14): a wait is the
run's next task stored pending but not due (``available_at`` at its deadline, and so the run's
``head_at``), so the claim never walks it before then; the run row says what it waits for. A
signal is kept in ``signals`` until a wait of its name takes it: its task is then due at once
and the run's head follows. Every statement that writes a run's wait or its signals locks the
run row first (the schema's lock order).

Its queries are in ``queries/waits.sql``, each named and described there (loaded and
checked when this module is imported).
"""

from __future__ import annotations

from ..queries import load, texts

# migration 7: what a run waits for, until when, on which task; the signals; which signal a
# task was resumed by; a child run's parent, the parent's join task and its place in the spawn;
# how many children a parent still waits for
MIGRATION_WAITS = """
    ALTER TABLE runs ADD COLUMN wait_for text;
    ALTER TABLE runs ADD COLUMN wait_until double precision;
    ALTER TABLE runs ADD COLUMN wait_task bigint;
    ALTER TABLE tasks ADD COLUMN signal_id bigint;
    CREATE TABLE signals (
        id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        run_id  bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        name    text   NOT NULL,
        payload json   NOT NULL DEFAULT 'null',
        sent_at double precision NOT NULL,
        task_id bigint
    );
    CREATE INDEX signals_kept ON signals (run_id, name, id) WHERE task_id IS NULL;
    CREATE INDEX signals_run ON signals (run_id);
    ALTER TABLE runs ADD COLUMN parent_id bigint;
    ALTER TABLE runs ADD COLUMN join_task bigint;
    ALTER TABLE runs ADD COLUMN spawn_ord bigint;
    ALTER TABLE runs ADD COLUMN children_left bigint;
    CREATE INDEX runs_parent ON runs (parent_id, join_task, spawn_ord)
        WHERE parent_id IS NOT NULL;
"""

# migration 14: a child's place in its parent's join has a column of its own,
# ``parent_join``; ``join_task`` is only a run's own join. One column for both lost a child's
# parent as soon as the child spawned children of its own: its end never reached that join.
# Children linked before keep what can be recovered: their own column's value, or (a child
# that spawned since) its parent's join.
MIGRATION_PARENT_JOIN = """
    ALTER TABLE runs ADD COLUMN parent_join bigint;
    UPDATE runs SET parent_join = join_task WHERE parent_id IS NOT NULL;
    UPDATE runs SET join_task = NULL WHERE parent_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM tasks WHERE tasks.id = runs.join_task AND tasks.run_id = runs.id);
    UPDATE runs SET parent_join = (SELECT p.join_task FROM runs AS p WHERE p.id = runs.parent_id)
        WHERE parent_id IS NOT NULL AND EXISTS (
            SELECT 1 FROM tasks WHERE tasks.id = runs.parent_join AND tasks.run_id = runs.id);
    DROP INDEX runs_parent;
    CREATE INDEX runs_parent ON runs (parent_id, parent_join, spawn_ord)
        WHERE parent_id IS NOT NULL;
"""

QUERIES = load("workerproc.store.postgres", "waits.sql", style="pyformat", internal=("CHILD_LEFT",))
globals().update(texts(QUERIES))


def __getattr__(name: str) -> str:  # the queries above, by name (for the type checker)
    raise AttributeError(f"no query {name} in {__name__}")
