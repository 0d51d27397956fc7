"""The PostgreSQL backend's claims, renewals and fenced commits (producers and operators are
in ``ops_sql``, reads in ``reads_sql``). A name of ``store.dialect.STATEMENTS`` is a statement
of the protocol's vocabulary; the others are parts that ``steps`` or the dialect run
(``LOCK_RUNS``).

Its queries are in ``queries/claims.sql`` (a claim's aftermath and the renewals) and
``queries/commits.sql`` (the fenced commits of one lease, the attempt history), each named and
described there (loaded and checked when this module is imported). What stays here is composed
at runtime, or shares its text with what is:

- the claims (``claim_sql``): a walk of the claim index per served queue, so the text depends
  on how many queues a worker names, and the number of leases may be written into it; the
  gated claim (``CLAIM_RUNS``) ends as every claim does (``_LEASING``), so it is composed from
  the same part instead of repeating it;
- the batched completions (``FINISH``, ``ADVANCE``, ``RELEASE``, ``HANDBACK``): templates of
  ``batch_sql``, each given a VALUES row per commit of the batch when it runs (``sized``);
  they are written from this module's fence (``_FENCE``), head (``head_of``) and notification
  (``NOTIFY``);
- the notification channels, named after the schema (``NOTIFY_CHANNEL``, ``END_CHANNEL``).

Time: ``%(now)s`` is NULL in production, and then every statement reads the database clock
(``clock_timestamp()``) once, inside the statement; a test injects its clock through the same
parameter. Fenced statements lock the run row FIRST (the ``run`` CTE) and read "now" only after
that lock is held, so a write that waited behind another is judged at the instant it got its
turn. A lease is the run's row of ``leases`` (schema v9); fenced statements match its task id
AND owner AND attempt AND a live expiry (R2): zero rows means the caller's lease is lost.
Statements whose row count matters return a row per row changed (the store counts what it
fetches). JSON goes out as text: the store decodes it (``codec.loads``), so a value no worker
can decode fails its run instead of its claimer.

No trigger runs on this path: each statement keeps the run's head columns exact itself (the
schema's docstring), deletes the lease it ends and writes the task once.
"""

from __future__ import annotations

from functools import cache

from ..queries import load, texts
from . import batch_sql as b
from .fragments import CLOCK as _CLOCK
from .fragments import NO_HEAD as _NO_HEAD

ALIVE = "('pending')"  # a run that may still change (a lease on it says "running")
# work became claimable: idle workers listen on the schema's channel (folded per transaction)
NOTIFY = "pg_notify('leasekeeper.' || current_schema(), '')"
NOTIFY_CHANNEL = "leasekeeper.{schema}"  # work: a run became claimable, or will be sooner
END_CHANNEL = "leasekeeper.{schema}.end"  # a watched run ended (Store.wait)

# The fence every write after a claim carries (R2, R5), the one fence of every statement: ``i``
# holds the statement's leases (one row each: run_id, task_id, attempt, owner), ``l`` is the
# lease row, ``clock`` in the FROM list. The statements of ``queries/*.sql`` write it out alike.
# (tests/support/unfenced.py rewrites it, in every statement, to break the fence on purpose.)
_FENCE = """l.run_id = i.run_id AND l.task_id = i.task_id AND l.attempts = i.attempt
    AND l.owner = i.owner AND l.expires_at > clock.now"""
# what an ended lease counted, written on its task
_COUNTS_OF = """attempts = f.attempts, attempt_base = f.attempt_base, claimed_at = f.claimed_at"""


def head_of(run: str, *, without: str | None = None, extra: str | None = None) -> str:
    """The head columns of run ``run``: its first pending task in R1 order (available_at,
    created_at, id), leaving out task ``without`` and counting ``extra`` (a row of those three
    and its line, written by the same statement, which its snapshot cannot see yet). A head
    with limits puts the run in its line (``line``, ``line_at``), not in the claim index
    (``head_at`` NULL): schema v11."""
    skip = f" AND h.id <> {without}" if without else ""
    more = f" UNION ALL SELECT {extra}" if extra else ""
    return f"""(head_at, line_at, head_created, head_id, line) = (
        SELECT CASE WHEN f.line IS NULL THEN f.a END, CASE WHEN f.line IS NOT NULL THEN f.a END,
            f.c, f.i, f.line
        FROM (SELECT h.available_at AS a, h.created_at AS c, h.id AS i, h.line AS line
              FROM tasks AS h WHERE h.run_id = {run} AND h.done_at IS NULL{skip}{more}) AS f
        ORDER BY f.a, f.c, f.i LIMIT 1)"""


# -- claims (R1) ----------------------------------------------------------------------------------
# One statement leases the head task of up to ``%(limit)s`` runs of the served queues, a higher
# priority first, then in head order (the head is a run's first pending task in R1 order,
# (available_at, created_at, id), kept on the run row).
#
# - ``levels``: the priority levels that have pending runs, found by a loose index scan (one
#   index probe per level: ``min(priority) > the last one``), from the lowest level up, so each
#   probe reads its level from its newest end (a backward scan of runs_prio). Runs end roughly
#   in head order, so a level's dead entries pile up at its oldest end: while another client's
#   snapshot holds the horizon back (docs/how-to/postgresql.md, "When vacuum cannot run"),
#   none of them can be marked dead, and a probe from the oldest end (``max(priority)``) read
#   every run of every queue that ended since (22,000 heap fetches a claim after 110 s at 200
#   runs/s); from the newest end it meets a live run at once while there is work.
# - Dead entries also fool the planner: the statistics count live rows only, so under a held
#   horizon "pending" looks like a handful of rows. The walk's status test is written so that
#   no index can serve it (``IS TRUE``: runs_status holds a dead 'pending' entry for every run
#   that ended, and was taken for a tiny index), and the head task is looked up by its keys in
#   a subquery of its own (``OFFSET 0``: flattened, it was planned as a walk of every entry of
#   tasks_pending, joined after). The "no live lease" probe is a scalar subquery (a lease is
#   keyed by its run): one descent of leases_pkey a run walked. As ``NOT EXISTS`` it became an
#   anti-join whose inner side, "a table of a few rows" by its statistics, was a full scan of
#   leases_pkey with a filter, again for each run walked: every lease inserted and deleted since
#   the horizon was held, 1.7 ms a run after a minute at 200 runs/s.
# - per level, highest first, a range scan of the claim index bounded by ``head_at <= now``
#   (delayed runs are never walked, however many there are) picks runs that are alive, due and
#   hold no live lease, ``FOR UPDATE SKIP LOCKED``: a run another claimer holds is skipped,
#   never waited for. Rows are locked one by one as the ``LIMIT`` pulls them, so no more runs
#   are locked than are claimed. Several named queues are walked unlocked, each in head order,
#   merged (one ordered stream), and each run of the stream is locked as the limit pulls it.
# - The walk's snapshot may be older than a lease another claimer committed meanwhile: the
#   lease row itself arbitrates. ``leased`` inserts the run's lease, or takes an expired (or
#   handed back) one over in place, only where the newest lease row has ended
#   (``ON CONFLICT ... WHERE``); a run locked but not leased comes back without a task and
#   the store claims again (a fresh snapshot). A run whose head was written after the snapshot
#   comes back the same way. Each run gives one task, so not even one statement can hand out
#   two leases in one run, and the lease table's primary key could not hold two.
# - ``granted``: "now" read again once every picked run is locked (``count(*)`` pulls them all).
#   The walk's "now" was read before its locks: a run whose last lease ended while the walk was
#   on its way would otherwise get a lease stamped before the previous one ended. The lease
#   starts, and its ttl counts, from the moment it was granted.
# - A takeover counts on from the lease it replaces (the same task: attempt + 1) and writes the
#   replaced attempt into the history (``taken``); a lease that moves to another task of the
#   run (a task written ahead of it by hand) leaves its counts on its own task first (``kept``).
# - The leases come back in claim order (priority, then head order), so a worker that claims
#   more than it can start at once starts them in that order too.
_CLAIMABLE = """r.priority = lv.p AND r.head_at <= (SELECT now FROM clock)
          AND r.head_at >= %(floor)s::float8
          AND (r.status = 'pending') IS TRUE
          AND coalesce((SELECT l.expires_at FROM leases AS l WHERE l.run_id = r.id),
                       '-infinity') <= (SELECT now FROM clock)"""
_PICK = f"""SELECT r.id, r.head_id, r.state::text AS state, r.revision, r.queue, r.head_at,
            r.head_created, r.parent_id, r.join_task, r.traceparent
        FROM runs AS r
        WHERE {{queue}}{_CLAIMABLE}
        ORDER BY r.head_at, r.head_created, r.head_id
        LIMIT %(limit)s FOR UPDATE OF r SKIP LOCKED"""
# one queue's claimable runs of a level in head order, not locked (several queues' walks merge);
# its own bound keeps it an index walk whatever the statistics say, with room for the runs
# other claimers hold meanwhile (skipped by the lock)
_WALK = f"""SELECT r.id, r.head_at, r.head_created, r.head_id FROM runs AS r
            WHERE r.queue = (%(queues)s::text[])[{{i}}] AND {_CLAIMABLE}
            ORDER BY r.head_at, r.head_created, r.head_id LIMIT 4 * %(limit)s + 64"""
# each run of the merged walks, locked as the limit pulls it (and still claimable)
_LOCK_EACH = """SELECT r.id, r.head_id, r.state::text AS state, r.revision, r.queue, r.head_at,
            r.head_created, r.parent_id, r.join_task, r.traceparent
        FROM ({walks}) AS w(id, head_at, head_created, head_id)
        CROSS JOIN LATERAL (SELECT * FROM runs AS r WHERE r.id = w.id
            AND r.head_at <= (SELECT now FROM clock) AND r.status || '' = 'pending'
            FOR UPDATE SKIP LOCKED) AS r
        ORDER BY w.head_at, w.head_created, w.head_id
        LIMIT %(limit)s"""
# every queue: the levels and the walks use runs_prio (priority DESC, head order)
_EVERY_LEVEL = """levels(p) AS (
    SELECT (SELECT min(priority) FROM runs WHERE head_at >= %(floor)s::float8)
    UNION ALL
    SELECT (SELECT min(priority) FROM runs WHERE head_at >= %(floor)s::float8
            AND priority > levels.p)
    FROM levels WHERE levels.p IS NOT NULL)"""
# named queues: every level (the loose scan of runs_prio above, whose leading column is the
# priority: each probe is one index descent) for each served queue; each queue's walks then
# use runs_claim (queue, priority DESC, head order). A probe per queue for its next level
# (``max(priority) WHERE queue = q AND priority < p``) was planned on runs_prio filtered by
# queue, and below a queue's last level it walked every run of the lower levels of the other
# queues: 16 ms a probe among a million runs, 50-270 ms a claim from 10 queues
_NAMED_LEVELS = """served(q) AS (SELECT unnest(%(queues)s::text[])),
every_level(p) AS (
    SELECT (SELECT min(priority) FROM runs WHERE head_at >= %(floor)s::float8)
    UNION ALL
    SELECT (SELECT min(priority) FROM runs WHERE head_at >= %(floor)s::float8
            AND priority > every_level.p)
    FROM every_level WHERE every_level.p IS NOT NULL),
levels(q, p) AS (SELECT served.q, every_level.p FROM served CROSS JOIN every_level)"""


def _unstarted(row: str, prefix: str = "") -> str:
    """1 where lease ``row`` (its columns named ``prefix``...) is taken over without its
    handler ever having begun, else 0: that attempt is not counted (B3)."""
    return (f"(CASE WHEN {row}.{prefix}owner IS NOT NULL AND NOT {row}.{prefix}started "
            "THEN 1 ELSE 0 END)")  # fmt: skip


# granted, heads, leased, taken, kept: what every claim does with the runs it picked (the
# walk's, or a gated claim's admitted ones): read "now" again, lease each run's head (its gates
# and its reservation with it), and answer in claim order. A lease is recorded as begun when
# the claim says so (``start``, B3), unless the claimer takes it over from itself: its older
# handler may still run in that worker, and the new one begins (recorded by the renewal that
# confirms it) only once that one ended
_LEASING = f"""granted AS MATERIALIZED (SELECT {_CLOCK} AS now FROM (SELECT count(*) FROM picked)
    AS locked),
heads AS MATERIALIZED (
    SELECT p.id AS run_id, t.id AS task_id, t.name, t.payload::text AS payload, t.attempts,
        t.attempt_base, t.gate_a, t.gate_b, t.gate_c, t.tokens, t.signal_id, t.version
    FROM picked AS p CROSS JOIN granted
    CROSS JOIN LATERAL (SELECT * FROM tasks AS t WHERE t.id = p.head_id AND t.run_id = p.id
                        AND t.done_at IS NULL OFFSET 0) AS t
    WHERE p.head_at <= granted.now),
leased AS (
    INSERT INTO leases AS l (run_id, task_id, owner, attempts, attempt_base, expires_at,
                             claimed_at, gate_a, gate_b, gate_c, reserved, started)
    SELECT h.run_id, h.task_id, %(owner)s, h.attempts + 1, h.attempt_base,
        granted.now + %(ttl)s, granted.now, h.gate_a, h.gate_b, h.gate_c, h.tokens,
        %(start)s::boolean
    FROM heads AS h, granted
    ON CONFLICT (run_id) DO UPDATE SET task_id = excluded.task_id, owner = excluded.owner,
        attempts = CASE WHEN l.task_id = excluded.task_id THEN l.attempts + 1
                        ELSE excluded.attempts END,
        attempt_base = CASE WHEN l.task_id = excluded.task_id
                            THEN l.attempt_base + {_unstarted("l")}
                            ELSE excluded.attempt_base END,
        expires_at = excluded.expires_at, claimed_at = excluded.claimed_at,
        gate_a = excluded.gate_a, gate_b = excluded.gate_b, gate_c = excluded.gate_c,
        reserved = excluded.reserved,
        started = excluded.started AND l.owner IS DISTINCT FROM excluded.owner,
        prev_task = l.task_id, prev_owner = l.owner, prev_attempts = l.attempts,
        prev_base = l.attempt_base, prev_claimed_at = l.claimed_at,
        prev_expires_at = l.expires_at, prev_started = l.started,
        prev_reserved = CASE WHEN l.owner IS NOT NULL THEN l.reserved END
    WHERE l.expires_at <= excluded.claimed_at
    RETURNING l.run_id, l.task_id, l.attempts, l.attempt_base, l.expires_at, l.claimed_at,
        l.prev_task, l.prev_owner, l.prev_attempts, l.prev_base, l.prev_claimed_at,
        l.prev_expires_at, l.gate_a, l.gate_b, l.gate_c, l.reserved, l.prev_started,
        CASE WHEN l.prev_owner IS NOT NULL THEN l.prev_reserved END AS given_back),
taken AS (
    INSERT INTO task_attempts (run_id, task_id, attempt, owner, claimed_at, ended_at, outcome,
                               taken_by)
    SELECT run_id, prev_task, prev_attempts, prev_owner, prev_claimed_at, prev_expires_at,
        CASE WHEN prev_started THEN 'taken_over' ELSE 'unstarted' END, %(owner)s
    FROM leased WHERE prev_owner IS NOT NULL),
kept AS (
    UPDATE tasks AS t SET attempts = x.prev_attempts,
        attempt_base = x.prev_base + {_unstarted("x", "prev_")},
        claimed_at = x.prev_claimed_at
    FROM leased AS x WHERE t.id = x.prev_task AND x.prev_task <> x.task_id)
SELECT x.task_id, p.id, h.name, h.payload, x.attempts, x.attempt_base, x.expires_at,
    x.prev_owner IS NOT NULL AS takeover, x.claimed_at, p.state, p.revision, p.queue,
    (SELECT o.options::text FROM task_options AS o WHERE o.name = h.name), h.signal_id,
    p.parent_id, p.join_task, x.gate_a, x.gate_b, x.gate_c, x.reserved, p.traceparent,
    x.given_back, h.version
FROM picked AS p LEFT JOIN leased AS x ON x.run_id = p.id LEFT JOIN heads AS h ON h.run_id = p.id
ORDER BY p.p DESC, p.head_at, p.head_created, p.head_id"""
_CLAIM = f"""
WITH RECURSIVE clock AS MATERIALIZED (SELECT {_CLOCK} AS now),
{{levels}},
picked AS MATERIALIZED (
    SELECT c.id, c.head_id, c.state, c.revision, c.queue, lv.p, c.head_at, c.head_created,
        c.parent_id, c.join_task, c.traceparent
    FROM (SELECT DISTINCT p FROM levels WHERE p IS NOT NULL ORDER BY p DESC) AS lv
    CROSS JOIN LATERAL ({{level}}) AS c
    LIMIT %(limit)s),
{_LEASING.replace("{", "{{").replace("}", "}}")}"""
# a gated claim (``protocol/gates.py``) leases the head task of each run it admitted from its
# gates' lines (locked already, by LINE_RUNS), as any claim does
CLAIM_RUNS = f"""
WITH clock AS MATERIALIZED (SELECT {_CLOCK} AS now),
picked AS MATERIALIZED (
    SELECT r.id, r.head_id, r.state::text AS state, r.revision, r.queue, r.priority AS p,
        r.line_at AS head_at, r.head_created, r.parent_id, r.join_task, r.traceparent
    FROM (SELECT u.id FROM unnest(%(run_ids)s::bigint[]) AS u(id) ORDER BY u.id) AS u
    CROSS JOIN LATERAL (SELECT * FROM runs AS r WHERE r.id = u.id AND r.status = 'pending'
        AND r.line_at <= (SELECT now FROM clock) FOR UPDATE) AS r),
{_LEASING}"""


MAX_CLAIM_TEXTS = 256  # limits up to this are written into the claim's text (see claim_sql)


# B22: a claimer with a list of the tasks it serves (``%(tasks)s``) walks past runs whose head
# task is none of them (one primary key probe per run walked; left out of the text without one):
# its name for an unversioned task, "name@version" for one at a version (B25)
_SERVED = """
          AND (SELECT coalesce(h.name || '@' || h.version, h.name) FROM tasks AS h
               WHERE h.id = r.head_id) = ANY(%(tasks)s::text[])"""


@cache
def claim_sql(
    queues: int | None, limit: int | None = None, skip: bool = False, served: bool = False
) -> str:
    """The claim for every queue (None) or for ``queues`` named queues (``%(queues)s``, no
    name twice); ``skip``: every queue but those of ``%(skip)s`` (a worker's claim for its
    users' slots, which leaves the webhooks' queue to its delivery lane, B20); ``served``: of
    the runs whose head task is one of ``%(tasks)s`` only (B22). With
    ``limit``, the number of leases is written into the text instead of ``%(limit)s``: a
    prepared statement's generic plan then knows it is a short walk of the claim index (a
    parameter's LIMIT is planned as a tenth of the table), and the session plans it once
    instead of at every claim. A worker asks for a handful of limits only."""
    sql = _claim_sql(queues, skip)
    if served:
        if _CLAIMABLE not in sql:  # the served filter must never fall out silently
            raise RuntimeError("the claim's text lost its claimable test: no served filter")
        sql = sql.replace(_CLAIMABLE, _CLAIMABLE + _SERVED)
    return sql if limit is None else sql.replace("%(limit)s", str(int(limit)))


def _claim_sql(queues: int | None, skip: bool = False) -> str:
    if queues is None:
        other = "r.queue <> ALL(%(skip)s::text[]) AND " if skip else ""
        return _CLAIM.format(levels=_EVERY_LEVEL, level=_PICK.format(queue=other))
    if queues < 1:
        raise ValueError("a claim serves at least one queue")
    if queues == 1:
        level = _PICK.format(queue="r.queue = (%(queues)s::text[])[1] AND ")
    else:  # the queues' walks merge unlocked; each run is locked as the limit pulls it
        walks = "\n            UNION ALL ".join(
            f"({_WALK.format(i=i)})" for i in range(1, queues + 1)
        )
        level = _LOCK_EACH.format(walks=walks)
    return _CLAIM.format(levels=_NAMED_LEVELS, level=level)


CLAIM = claim_sql(None)  # every queue, any limit (``steps.claim`` writes the limit in)
# a batch's claim: one task's runs (%(task)s), from the named queues (NULL: every queue but those
# of %(skip)s), every level walked in head order as the claim for every queue walks it
_OF_TASK = """r.queue <> ALL(%(skip)s::text[])
          AND (%(queues)s::text[] IS NULL OR r.queue = ANY(%(queues)s::text[]))
          AND EXISTS (SELECT 1 FROM tasks AS h WHERE h.id = r.head_id AND h.name = %(task)s
                      AND (%(tasks)s::text[] IS NULL OR coalesce(h.name || '@' || h.version,
                                                                 h.name) = ANY(%(tasks)s::text[])))
          AND """
CLAIM_TASK = _CLAIM.format(levels=_EVERY_LEVEL, level=_PICK.format(queue=_OF_TASK))


# -- batched completions (R2, R5) -----------------------------------------------------------------
# the completions, each one statement for a batch of N >= 1 commits (``batch_sql``): release
# gives a task back after a delay, keeping the error (on the task and the run) and the
# attempt's end in the history, and the run's head follows the task; hand-back gives back a
# task that never started, without spending an attempt
RELEASE = b.release(_CLOCK, _FENCE, head_of(
    "r.id", without="x.id", extra="x.available_at, x.created_at, x.id, x.line"
), ALIVE, NOTIFY, _COUNTS_OF)  # fmt: skip
HANDBACK = b.handback(_CLOCK, _FENCE, NOTIFY)

# finish / advance, the hot path: the compare-and-set of SET_STATE (fence included) for each commit
# of the batch, then, only where it matched, the lease goes and its task is written done,
# once. Finish clears the run's head (a finished run has none); advance inserts the next task
# (its id drawn first) and makes it the head (unless a task of the run comes before it),
# moves the run to ``queue`` if one is given, and tells idle workers
FINISH = b.finish(_CLOCK, _FENCE, _NO_HEAD, ALIVE)
SET_STATE = b.set_state(_CLOCK, _FENCE, ALIVE)  # compare_and_set: the lease stays
ADVANCE = b.advance(_CLOCK, _FENCE, head_of(
    "r.id", without="i.task_id", extra="clock.now + i.delay, clock.now, i.next_id, i.line"
), ALIVE, NOTIFY)  # fmt: skip

# -- named queries: renewals, the fenced commits of one lease (``queries/*.sql``) -------------
QUERIES = load("workerproc.store.postgres", "claims.sql", style="pyformat") | load(
    "workerproc.store.postgres",
    "commits.sql",
    style="pyformat",
    internal=("LOCK_RUNS", "SUCCEED_IF_EMPTY"),
)
globals().update(texts(QUERIES))
LOCK_RUNS: str = QUERIES["LOCK_RUNS"].sql  # (imported by name: the dialect locks a batch's runs)


def __getattr__(name: str) -> str:  # the queries above, by name (for the type checker)
    raise AttributeError(f"no query {name} in {__name__}")
