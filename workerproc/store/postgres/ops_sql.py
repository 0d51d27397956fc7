"""The PostgreSQL backend's producers, operators, finished-run totals and worker list, each
statement named with its one-line purpose (claims and commits are in ``sql``). Operators hold
the run row first (``RUN_STATUS ... FOR UPDATE``), then write its tasks and lease.

Its queries are in ``queries/ops.sql``, each named and described there (loaded and
checked when this module is imported).
"""

from __future__ import annotations

from ..queries import load, texts

QUERIES = load(
    "workerproc.store.postgres",
    "ops.sql",
    style="pyformat",
    internal=("LOCK_OWNER_RUNS", "NOW", "SNAPSHOT", "WATCH_RUN", "CALLERS_DATABASE"),
    fields=("s", "channel"),
)
globals().update(texts(QUERIES))
# the producers' statements and the check of a caller's connection name our tables with a
# schema prefix (``{s}``): empty on our own connections, whose search path is the schema; on a
# caller's connection (transactional enqueue) the schema, and the notification channel spelt
# out (``{channel}``), by ``steps`` and ``admin``
_INSERT_RUNS = QUERIES["INSERT_RUNS"].sql
_FIND_BY_KEYS = QUERIES["FIND_BY_KEYS"].sql
_KEY_RUN = QUERIES["KEY_RUN"].sql
_DEBOUNCE_RUN = QUERIES["DEBOUNCE_RUN"].sql
_RELEASE_KEY = QUERIES["RELEASE_KEY"].sql
CALLERS_DATABASE = QUERIES["CALLERS_DATABASE"].sql
INSERT_RUNS = _INSERT_RUNS.format(s="", channel="'leasekeeper.' || current_schema()")
FIND_BY_KEYS = _FIND_BY_KEYS.format(s="")
KEY_RUN = _KEY_RUN.format(s="")
DEBOUNCE_RUN = _DEBOUNCE_RUN.format(s="")
RELEASE_KEY = _RELEASE_KEY.format(s="")


def __getattr__(name: str) -> str:  # the queries above, by name (for the type checker)
    raise AttributeError(f"no query {name} in {__name__}")
