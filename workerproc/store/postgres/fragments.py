"""SQL fragments that several of the PostgreSQL backend's statement modules share (``sql``,
``ops_sql`` and the other ``*_sql`` modules): the clock every statement reads and the reset of
a run's head columns. Public names: a module may import what another one defines only when it is
public.
"""

from __future__ import annotations

# "now": NULL ``%(now)s`` in production reads the database clock, once, inside the statement; a
# test injects its clock through the same parameter
CLOCK = "coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)"
# "now", read once per statement, for statements that lock nothing first
CLOCK_CTE = f"WITH clock AS MATERIALIZED (SELECT {CLOCK} AS now)"
# a run with no pending task left: its head columns (and its line) cleared
NO_HEAD = "head_at = NULL, head_created = NULL, head_id = NULL, line_at = NULL, line = NULL"
