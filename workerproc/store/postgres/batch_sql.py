"""The hot path's commits of a batch as one statement (``steps.many``): a worker that finishes
several runs in one exchange sends one ``FINISH_MANY``, its commits as arrays, instead of one
``FINISH`` per run. The server then starts one executor, and builds the tables' CHECK
constraints from their stored text once per exchange instead of once per run (a good part of
its CPU per run). Every commit is still judged on its own: its own fence (task id AND owner AND
attempt AND a live lease, ``sql._FENCE_EACH``) and its own revision, exactly as ``sql.FINISH``
judges it, row by row. The batch's runs are distinct (the protocol sends a run at most once per
batch) and locked in id order before "now" is read, as every batch locks them (lock order).

``sql`` builds the statement from its own fence and clock (``sql.FINISH_MANY``), so the
statement lives beside the others it must agree with (tests/unfenced.py rewrites it there).
"""

from __future__ import annotations


def finish_many(clock: str, fence_each: str, no_head: str, alive: str) -> str:
    """Finish, for every commit of the batch (``i``: one row each, one owner): the fenced
    compare-and-set that ends the run, then, only where it matched, the lease goes and its task
    is written done, once, with the attempt and owner that committed. A row comes back for
    each run whose compare-and-set matched."""
    return f"""
WITH run AS MATERIALIZED (
    SELECT id FROM runs WHERE id = ANY(%(run_ids)s::bigint[]) ORDER BY id FOR UPDATE),
clock AS MATERIALIZED (SELECT {clock} AS now FROM (SELECT count(*) FROM run) AS locked),
i AS MATERIALIZED (
    SELECT * FROM unnest(%(runs)s::bigint[], %(task_ids)s::bigint[], %(attempts)s::int[],
        %(revisions)s::bigint[], %(states)s::text[], %(results)s::text[])
    AS i(run_id, task_id, attempt, revision, state, result)),
cas AS (UPDATE runs AS r SET state = i.state::json, revision = r.revision + 1,
    status = 'succeeded', result = i.result::json, finished_at = clock.now,
    updated_at = clock.now, {no_head}
    FROM i, clock WHERE r.id = i.run_id AND r.revision = i.revision AND r.status IN {alive}
      AND EXISTS (SELECT 1 FROM leases AS l WHERE {fence_each})
    RETURNING r.id),
fenced AS MATERIALIZED (
    DELETE FROM leases AS l USING cas, i, clock WHERE i.run_id = cas.id AND {fence_each}
    RETURNING l.*, i.attempt AS committed),
done AS (
    UPDATE tasks AS t SET done_at = clock.now, done_attempt = f.committed,
        done_owner = %(owner)s, attempts = f.attempts, attempt_base = f.attempt_base,
        claimed_at = f.claimed_at
    FROM fenced AS f, clock WHERE t.id = f.task_id)
SELECT id FROM cas"""
