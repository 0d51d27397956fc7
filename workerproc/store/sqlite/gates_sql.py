"""The SQLite backend's flow-control schema changes that came after its first
migration; the statements themselves are in ``sql.py``."""

from __future__ import annotations

# migration 15: ``OPEN_GATES`` reads the open gates in (ready_at, gate) order: an index of both
# serves it without sorting the thousands of gates a claim made ready at the same instant
GATES_READY_ORDER = """
    CREATE INDEX gates_ready_gate ON gates (ready_at, gate) WHERE ready_at IS NOT NULL;
    DROP INDEX gates_ready;
"""

# migration 19: a line closed only because none of its runs is due yet (``ready_at``:
# the first one's time) is ``idle``: a run that joins it due sooner opens it at once, while a
# line closed for want of room stays closed until its room comes (a settle reopens it)
# (and ``turn``: its place in the lines' round robin, the ``ready_at`` it was last open at: a
# line a full gate closed goes back to its place when it reopens, never after lines served
# since, and lines reopened together keep their order rather than their names')
GATES_IDLE = """
    ALTER TABLE gates ADD COLUMN idle INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE gates ADD COLUMN turn REAL;
"""
