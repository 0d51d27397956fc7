"""The completions, each one statement for a batch of N >= 1 commits (``FINISH``, ``ADVANCE``,
``RELEASE``, ``HANDBACK``, ``SET_STATE``): the commits go as a VALUES list written for the
batch's size (``sized``; ``steps.Each`` names each commit's parameters), ``i``, one row per
commit, and every row is judged on its own: its own fence (task id AND owner AND attempt AND a
live lease, ``sql._FENCE``) and, for a compare-and-set (a finish, an advance, a set), its own
revision: the compare-and-set is written once (``_cas``). One statement whatever N:
the server starts one executor and builds the tables' CHECK constraints from their stored text
once per batch instead of once per run (a good part of its CPU per run). The batch's runs are
distinct (the protocol sends a run at most once per statement) and locked in id order before
"now" is read, as every batch locks them (lock order). A row comes back for each commit
written: its run's id.

``sql`` builds the statements from its own fence, clock and head, so they live beside the
others they must agree with (tests/support/unfenced.py rewrites them there).
"""

from __future__ import annotations

from functools import cache

# each commit's lease, the first columns of every batch: (its parameter, the column's type)
LEASE = (("run_id", "bigint"), ("task_id", "bigint"), ("attempt", "int"), ("owner", "text"))
FINISH_COLUMNS = (*LEASE, ("revision", "bigint"), ("state", "text"), ("result", "text"))
ADVANCE_COLUMNS = (*LEASE, ("revision", "bigint"), ("state", "text"), ("queue", "text"),
                   ("name", "text"), ("payload", "text"), ("delay", "float8"), ("line", "text"),
                   ("gate_a", "text"), ("gate_b", "text"), ("gate_c", "text"),
                   ("tokens", "int"), ("version", "int"))  # fmt: skip
RELEASE_COLUMNS = (*LEASE, ("delay", "float8"), ("error", "text"))
HANDBACK_COLUMNS = LEASE
SET_STATE_COLUMNS = (*LEASE, ("revision", "bigint"), ("state", "text"))


ROWS = "/* a row per commit */"  # where ``sized`` writes the batch's rows


def each(columns: tuple[tuple[str, str], ...]) -> str:
    """The commits as rows (``u``: one per commit, its columns named for their parameters, and
    ``n``: its place in the batch), a VALUES list ``sized`` writes for the batch."""
    names = ", ".join(name for name, _ in columns)
    return f"SELECT * FROM (VALUES {ROWS}) AS u({names}, n)"


@cache
def sized(statement: str, columns: tuple[tuple[str, str], ...], n: int) -> str:
    """``statement`` for a batch of ``n`` commits: its VALUES list written out, commit ``k``'s
    parameters suffixed ``_k``. The number of rows is in the text, so the session prepares a
    statement per batch size a worker uses, and its generic plan knows how many rows there are
    (an array parameter is planned as ten, and the server planned it again at every run)."""
    rows = ",\n        ".join(
        "(" + ", ".join(f"%({name}_{k})s::{kind}" for name, kind in columns) + f", {k})"
        for k in range(n)
    )
    return statement.replace(ROWS, rows)


def finish(clock: str, fence: str, no_head: str, alive: str) -> str:
    """Finish: the fenced compare-and-set that ends the run, then, only where it matched, the
    lease goes and its task is written done, once, with the attempt and owner that
    committed."""
    ends = f"""status = 'succeeded', result = i.result::json, finished_at = clock.now,
    updated_at = clock.now, {no_head}"""
    return f"""
WITH i AS MATERIALIZED ({each(FINISH_COLUMNS)}),
{_locked(clock)},
{_cas(fence, alive, ends)},
{_done(fence)}
SELECT id FROM cas"""


def advance(clock: str, fence: str, head: str, alive: str, notify: str) -> str:
    """Advance (the next task's id drawn for each commit in the batch's order): the fenced
    compare-and-set, then, only where it matched, the lease goes, its task is written done,
    the run moves to ``queue`` if one is given and the next task is inserted, keeping what it is
    entered with (the state written, the run's queue: B24); ``head`` makes
    it the run's head unless a task of the run comes before it (``sql.head_of``). Idle
    workers are told."""
    moves = f"queue = coalesce(i.queue, r.queue), updated_at = clock.now, {head}"
    return f"""
WITH i AS MATERIALIZED (
    SELECT u.*, nextval(pg_get_serial_sequence('tasks', 'id')) AS next_id
    FROM ({each(ADVANCE_COLUMNS)} ORDER BY u.n) AS u),
{_locked(clock)},
{_cas(fence, alive, moves)},
{_done(fence)},
next_task AS (INSERT INTO tasks (id, run_id, name, payload, available_at, created_at, line,
                                 gate_a, gate_b, gate_c, tokens, input_state, input_queue,
                                 version)
    SELECT i.next_id, cas.id, i.name, i.payload::json, clock.now + i.delay, clock.now, i.line,
        i.gate_a, i.gate_b, i.gate_c, i.tokens, i.state::json, cas.queue, i.version
    FROM cas JOIN i ON i.run_id = cas.id, clock)
SELECT id, {notify} FROM cas"""


def set_state(clock: str, fence: str, alive: str) -> str:
    """Compare-and-set (``Store.compare_and_set``): the fenced compare-and-set alone; the
    lease stays."""
    return f"""
WITH i AS MATERIALIZED ({each(SET_STATE_COLUMNS)}),
{_locked(clock)},
{_cas(fence, alive, "updated_at = clock.now")}
SELECT id FROM cas"""


def release(clock: str, fence: str, head: str, alive: str, notify: str, counts: str) -> str:
    """Release: give each task back after its delay, keeping its error (on the task, and on
    its run while that is alive) and its attempt's end in the history; the run's head follows
    the task (``head``, over ``x``: the released task). Its run's status test is served by
    no index (``IS TRUE``): runs_status holds a dead 'pending' entry for every run that ended
    since the oldest snapshot, which the statistics do not count."""
    return f"""
WITH i AS MATERIALIZED ({each(RELEASE_COLUMNS)}),
{_locked(clock)},
fenced AS MATERIALIZED (
    DELETE FROM leases AS l USING i, clock WHERE {fence}
    RETURNING l.*, i.delay, i.error),
history AS (
    INSERT INTO task_attempts (run_id, task_id, attempt, owner, claimed_at, ended_at, outcome,
                               error)
    SELECT f.run_id, f.task_id, f.attempts, f.owner, f.claimed_at, clock.now, 'released',
        f.error FROM fenced AS f, clock),
released AS (
    UPDATE tasks AS t SET available_at = clock.now + f.delay,
        last_error = coalesce(f.error, t.last_error), {counts}
    FROM fenced AS f, clock WHERE t.id = f.task_id
    RETURNING t.id, t.run_id, t.available_at, t.created_at, t.line, f.error),
moved AS (
    UPDATE runs AS r SET {head}, last_error = coalesce(x.error, r.last_error),
        updated_at = clock.now
    FROM released AS x, clock WHERE r.id = x.run_id AND (r.status IN {alive}) IS TRUE)
SELECT f.run_id, {notify} FROM fenced AS f"""


def handback(clock: str, fence: str, notify: str) -> str:
    """Hand-back: each claimed task that never started goes back at once; its claim does not
    count against max_attempts (attempt_base moves with attempts); the fencing token still
    moved on. The lease row stays, free (no owner), so the next claim counts on from it."""
    return f"""
WITH i AS MATERIALIZED ({each(HANDBACK_COLUMNS)}),
{_locked(clock)}
UPDATE leases AS l SET owner = NULL, expires_at = clock.now,
    attempt_base = l.attempt_base + 1 FROM i, clock WHERE {fence} RETURNING l.run_id, {notify}"""


def _cas(fence: str, alive: str, sets: str) -> str:
    """Each commit's compare-and-set (R5): its run's state moves at its revision, while the
    run is alive and the lease is live (the fence rides along); ``sets``: what else the run
    takes. A row per run written (``cas``)."""
    return f"""cas AS (UPDATE runs AS r SET state = i.state::json, revision = r.revision + 1,
    {sets}
    FROM i JOIN run ON run.id = i.run_id, clock
    WHERE r.id = run.id AND r.revision = i.revision AND run.status IN {alive}
      AND EXISTS (SELECT 1 FROM leases AS l WHERE {fence})
    RETURNING r.id, r.queue)"""


def _locked(clock: str) -> str:
    """The batch's runs locked in id order (held already: no-ops), then "now"."""
    return f"""run AS MATERIALIZED (
    SELECT id, status FROM runs WHERE id IN (SELECT run_id FROM i) ORDER BY id FOR UPDATE),
clock AS MATERIALIZED (SELECT {clock} AS now FROM (SELECT count(*) FROM run) AS locked)"""


def _done(fence: str) -> str:
    """Where a commit's compare-and-set matched (``cas``): its lease goes, and its task is
    written done, once, with the attempt and owner that committed."""
    return f"""fenced AS MATERIALIZED (
    DELETE FROM leases AS l USING cas, i, clock WHERE i.run_id = cas.id AND {fence}
    RETURNING l.*, i.attempt AS committed, i.owner AS committer),
done AS (
    UPDATE tasks AS t SET done_at = clock.now, done_attempt = f.committed,
        done_owner = f.committer, attempts = f.attempts, attempt_base = f.attempt_base,
        claimed_at = f.claimed_at
    FROM fenced AS f, clock WHERE t.id = f.task_id)"""
