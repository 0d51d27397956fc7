"""The SQLite backend's claims, renewals, fenced commits, producers and flow control (its reads
are in ``reads_sql``, its operators' in ``ops_sql``). A name of ``store.dialect.STATEMENTS`` is
a statement of the protocol's vocabulary; the others are parts that ``steps`` (and
``completions``) compose into one logical step (``FINISH`` is ``CAS_FINISH`` then
``TASK_DONE``).

Fenced statements match task id AND owner AND attempt AND a live lease (R2); zero rows changed
means the caller's lease is lost. ``:now`` is always read after ``BEGIN IMMEDIATE`` succeeded.

Its queries are in ``queries/claims.sql`` (claims and renewals), ``queries/commits.sql`` (the
fenced commits and the attempt history), ``queries/producers.sql`` (new runs and tasks, task
options) and ``queries/limits.sql`` (limits, gates and their lines), each named and described
there (loaded and checked when this module is imported). No statement is composed at runtime,
so nothing of SQLite's SQL stays here: the claims share two parts of ``claims.sql``
(``LEASE_INSERT``, the lease rows a claim writes, and ``LEASE_TAKEOVER``, how it takes over an
ended lease), written once and put in their ``{lease}`` and ``{takeover}`` when this module is
imported.
"""

from __future__ import annotations

from ..queries import Query, load, texts
from .leases_sql import PLACED

_PACKAGE = "workerproc.store.sqlite"
# (steps' parts: the vocabulary's statements are composed of them)
_INTERNAL = {
    "claims.sql": ("LEASE_INSERT", "LEASE_TAKEOVER", "RUN_STATES", "RENEW"),
    "commits.sql": ("HANDBACK_TASK", "RELEASE_TASK", "LEASE_GIVEN_BACK", "RUN_ERROR",
                    "CAS_STATE", "CAS_FINISH", "CAS_NEXT_TASK", "MOVE_RUN", "SUCCEED_IF_EMPTY",
                    "EXPIRE_OWNER", "REOPEN_OWNER_GATES"),
    "producers.sql": ("INSERT_RUN", "INSERT_SYSTEM_RUN", "FIND_BY_KEY", "INSERT_TASK"),
    "limits.sql": ("SET_LIMIT_NUMBERS", "REOPEN_LIMIT", "SETTLE_GATE", "REOPEN_BLOCKED",
                   "NEW_GATE", "LINE_JOINED", "REGATE_TASK", "PLACE_RUN", "WRITE_GATE"),
}  # fmt: skip
# the shared parts, by the field each fills: the claims' lease rows and takeover, and a run's
# placement (the head trigger's statement, for the regate)
_PARTS = ("lease", "takeover", "placed")
QUERIES: dict[str, Query] = {}
for _file, _internal in _INTERNAL.items():
    QUERIES.update(load(_PACKAGE, _file, style="named", internal=_internal, fields=_PARTS))
globals().update(texts(QUERIES))
_FILLED = {
    "lease": QUERIES["LEASE_INSERT"].sql,
    "takeover": QUERIES["LEASE_TAKEOVER"].sql,
    "placed": PLACED.strip().rstrip(";").format(run=":run_id"),
}
globals().update({q.name: q.sql.format(**_FILLED) for q in QUERIES.values() if q.fields})


def __getattr__(name: str) -> str:  # the queries above, by name (for the type checker)
    raise AttributeError(f"no query {name} in {__name__}")
