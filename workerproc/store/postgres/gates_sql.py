"""The PostgreSQL backend's flow control (``protocol/limits.py`` and
``protocol/gates.py``): limits, their gates, the gated claim's statements and the settling of a
lease's gates. A claimer locks every gate it looks at ``FOR UPDATE SKIP LOCKED`` (another
claimer's gates are skipped, never waited for); a commit settles its gates one by one in name
order, after its runs (lock order: runs, then gates), so no two transactions wait in a cycle.

Its queries are in ``queries/gates.sql``, each named and described there (loaded and
checked when this module is imported).
"""

from __future__ import annotations

from ..queries import load, texts

# migration 9: ``OPEN_GATES`` reads the open gates in (ready_at, gate) order: an index of both
# serves it without sorting the thousands of gates a claim made ready at the same instant
GATES_READY_ORDER = """
    CREATE INDEX gates_ready_gate ON gates (ready_at, gate) WHERE ready_at IS NOT NULL;
    DROP INDEX gates_ready;
"""

# migration 13: a line closed only because none of its runs is due yet (``ready_at``:
# the first one's time) is ``idle``: a run that joins it due sooner opens it at once, while a
# line closed for want of room stays closed until its room comes (a settle reopens it)
# (and ``turn``: its place in the lines' round robin, the ``ready_at`` it was last open at: a
# line a full gate closed goes back to its place when it reopens, never after lines served
# since, and lines reopened together keep their order rather than their names')
GATES_IDLE = """
    ALTER TABLE gates ADD COLUMN idle boolean NOT NULL DEFAULT false;
    ALTER TABLE gates ADD COLUMN turn double precision;
"""

QUERIES = load("workerproc.store.postgres", "gates.sql", style="pyformat",
               internal=("OPEN_MARKED",))  # fmt: skip
globals().update(texts(QUERIES))

# the first ``want`` gates OPEN_MARKED locked, read in a later statement of its round trip (a
# statement's snapshot then follows their locks: no holder's commit is missed)
_OPENED = "(current_setting('leasekeeper.opened')::text[])[1:%(want)s]"
# GATE_STATE of those gates
OPEN_STATES = QUERIES["GATE_STATE"].sql.replace("%(gates)s::text[]", _OPENED)
# LINE_RUNS of their lines: one run each when several gates are open, else ``want`` of one
_ONE_EACH = ("LIMIT CASE WHEN cardinality(current_setting('leasekeeper.opened')::text[]) > 1 "
             "THEN 1 ELSE %(want)s END")  # fmt: skip
OPEN_LINES = QUERIES["LINE_RUNS"].sql.replace("%(lines)s::text[]", _OPENED)
OPEN_LINES = OPEN_LINES.replace("LIMIT %(limit)s", _ONE_EACH)
assert OPEN_STATES.count(_OPENED) == 1 and OPEN_LINES.count(_OPENED) == 1
assert "ELSE %(want)s END" in OPEN_LINES


def __getattr__(name: str) -> str:  # the queries above, by name (for the type checker)
    raise AttributeError(f"no query {name} in {__name__}")
