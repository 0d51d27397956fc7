"""The SQLite backend's claims, renewals, fenced commits, producers and flow control (its reads
are in ``reads_sql``, its operators' in ``ops_sql``). A name of ``store.dialect.STATEMENTS`` is
a statement of the protocol's vocabulary; the others are parts that ``steps`` composes into one
logical step (``FINISH`` is ``CAS_FINISH`` then ``TASK_DONE``).

Fenced statements match task id AND owner AND attempt AND a live lease (R2); zero rows changed
means the caller's lease is lost. ``:now`` is always read after ``BEGIN IMMEDIATE`` succeeded.

Its queries are in ``queries/claims.sql`` (claims and renewals), ``queries/commits.sql`` (the
fenced commits and the attempt history), ``queries/producers.sql`` (new runs and tasks, task
options) and ``queries/limits.sql`` (limits, gates and their lines), each named and described
there (loaded and checked when this module is imported). Every statement is written out in
full: none is composed at runtime, so nothing of SQLite's SQL stays here.
"""

from __future__ import annotations

from ..queries import Query, load, texts

_PACKAGE = "workerproc.store.sqlite"
# (steps' parts: the vocabulary's statements are composed of them)
_INTERNAL = {
    "claims.sql": ("RUN_STATE", "RENEW"),
    "commits.sql": ("HANDBACK_TASK", "RELEASE_TASK", "LEASE_GIVEN_BACK", "RUN_ERROR",
                    "CAS_STATE", "CAS_FINISH", "CAS_NEXT_TASK", "MOVE_RUN", "SUCCEED_IF_EMPTY",
                    "EXPIRE_OWNER", "REOPEN_OWNER_GATES"),
    "producers.sql": ("INSERT_RUN", "INSERT_SYSTEM_RUN", "FIND_BY_KEY", "INSERT_TASK"),
    "limits.sql": ("SET_LIMIT_NUMBERS", "REOPEN_LIMIT", "SETTLE_GATE", "REOPEN_BLOCKED",
                   "NEW_GATE", "LINE_JOINED", "REGATE_TASK", "PLACE_RUN"),
}  # fmt: skip
QUERIES: dict[str, Query] = {}
for _file, _internal in _INTERNAL.items():
    QUERIES.update(load(_PACKAGE, _file, style="named", internal=_internal))
globals().update(texts(QUERIES))


def __getattr__(name: str) -> str:  # the queries above, by name (for the type checker)
    raise AttributeError(f"no query {name} in {__name__}")
