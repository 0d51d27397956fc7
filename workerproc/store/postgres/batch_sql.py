"""The hot path's commits of a batch as one statement (``steps.many``): a worker that finishes
(or advances) several runs in one exchange sends one ``FINISH_MANY`` (``ADVANCE_MANY``), its
commits as arrays, instead of one ``FINISH`` (``ADVANCE``) per run. The server then starts one
executor, and builds the tables' CHECK constraints from their stored text once per exchange
instead of once per run (a good part of its CPU per run). Every commit is still judged on its
own: its own fence (task id AND owner AND attempt AND a live lease, ``sql._FENCE_EACH``) and
its own revision, exactly as ``sql.FINISH`` (``sql.ADVANCE``) judges it, row by row. The
batch's runs are distinct (the protocol sends a run at most once per batch) and locked in id
order before "now" is read, as every batch locks them (lock order).

``sql`` builds the statements from its own fence, clock and head (``sql.FINISH_MANY``,
``sql.ADVANCE_MANY``), so they live beside the others they must agree with
(tests/support/unfenced.py rewrites them there).
"""

from __future__ import annotations


def finish_many(clock: str, fence_each: str, no_head: str, alive: str) -> str:
    """Finish, for every commit of the batch (``i``: one row each, one owner): the fenced
    compare-and-set that ends the run, then, only where it matched, the lease goes and its task
    is written done, once, with the attempt and owner that committed. A row comes back for
    each run whose compare-and-set matched."""
    return f"""
{_locked(clock)},
i AS MATERIALIZED (
    SELECT * FROM unnest(%(runs)s::bigint[], %(task_ids)s::bigint[], %(attempts)s::int[],
        %(revisions)s::bigint[], %(states)s::text[], %(results)s::text[])
    AS i(run_id, task_id, attempt, revision, state, result)),
cas AS (UPDATE runs AS r SET state = i.state::json, revision = r.revision + 1,
    status = 'succeeded', result = i.result::json, finished_at = clock.now,
    updated_at = clock.now, {no_head}
    FROM i JOIN run ON run.id = i.run_id, clock
    WHERE r.id = run.id AND r.revision = i.revision AND run.status IN {alive}
      AND EXISTS (SELECT 1 FROM leases AS l WHERE {fence_each})
    RETURNING r.id),
{_done(fence_each)}
SELECT id FROM cas"""


def advance_many(clock: str, fence_each: str, head: str, alive: str, notify: str) -> str:
    """Advance, for every commit of the batch (``i``: one row each, one owner, with the next
    task's id drawn in the batch's order): the fenced compare-and-set, then, only where it
    matched, the lease goes, its task is written done and the next task is inserted; ``head``
    makes it the run's head unless a task of the run comes before it (``sql.head_of``). A row
    comes back for each run whose compare-and-set matched, and idle workers are told."""
    return f"""
{_locked(clock)},
i AS MATERIALIZED (
    SELECT u.*, nextval(pg_get_serial_sequence('tasks', 'id')) AS next_id
    FROM (SELECT * FROM unnest(%(runs)s::bigint[], %(task_ids)s::bigint[], %(attempts)s::int[],
            %(revisions)s::bigint[], %(states)s::text[], %(queues)s::text[], %(names)s::text[],
            %(payloads)s::text[], %(delays)s::float8[], %(lines)s::text[],
            %(gates_a)s::text[], %(gates_b)s::text[], %(gates_c)s::text[], %(tokens)s::int[])
        WITH ORDINALITY AS u(run_id, task_id, attempt, revision, state, queue, name, payload,
                             delay, line, gate_a, gate_b, gate_c, tokens, n)
        ORDER BY u.n) AS u),
cas AS (UPDATE runs AS r SET state = i.state::json, revision = r.revision + 1,
    queue = coalesce(i.queue, r.queue), updated_at = clock.now, {head}
    FROM i JOIN run ON run.id = i.run_id, clock
    WHERE r.id = run.id AND r.revision = i.revision AND run.status IN {alive}
      AND EXISTS (SELECT 1 FROM leases AS l WHERE {fence_each})
    RETURNING r.id),
{_done(fence_each)},
next_task AS (INSERT INTO tasks (id, run_id, name, payload, available_at, created_at, line,
                                 gate_a, gate_b, gate_c, tokens)
    SELECT i.next_id, cas.id, i.name, i.payload::json, clock.now + i.delay, clock.now, i.line,
        i.gate_a, i.gate_b, i.gate_c, i.tokens
    FROM cas JOIN i ON i.run_id = cas.id, clock)
SELECT id, {notify} FROM cas"""


def _locked(clock: str) -> str:
    """The batch's runs locked in id order (held already: no-ops), then "now"."""
    return f"""WITH run AS MATERIALIZED (
    SELECT id, status FROM runs WHERE id = ANY(%(run_ids)s::bigint[]) ORDER BY id FOR UPDATE),
clock AS MATERIALIZED (SELECT {clock} AS now FROM (SELECT count(*) FROM run) AS locked)"""


def _done(fence_each: str) -> str:
    """Where a commit's compare-and-set matched (``cas``): its lease goes, and its task is
    written done, once, with the attempt and owner that committed."""
    return f"""fenced AS MATERIALIZED (
    DELETE FROM leases AS l USING cas, i, clock WHERE i.run_id = cas.id AND {fence_each}
    RETURNING l.*, i.attempt AS committed),
done AS (
    UPDATE tasks AS t SET done_at = clock.now, done_attempt = f.committed,
        done_owner = %(owner)s, attempts = f.attempts, attempt_base = f.attempt_base,
        claimed_at = f.claimed_at
    FROM fenced AS f, clock WHERE t.id = f.task_id)"""
