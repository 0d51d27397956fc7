"""A deliberately broken store (SQLite and PostgreSQL), for the tests that must see fencing fail.

Test code only: ``disable_fencing()`` rewrites, in this process, every statement of each backend
that carries the fence (task id AND owner AND attempt AND a live lease) so that it only asks
"this task's lease, whoever holds it". Any former holder may then renew, commit and ack:
exactly the zombie writes the chaos verifier must catch. A backend's statements live in two
places: the names of its ``sql`` module (which its steps read at each call: the named queries
it loaded from its ``queries/*.sql`` files, and on PostgreSQL the statements composed in
Python) and its catalogue (the statements the protocol runs by name); both are rewritten, the
loaded text included.
Nothing in ``workerproc`` or ``supervisor`` knows this module exists; a supervisor gets it by
importing ``apps.chaos_unfenced`` as its app before it forks, so every worker inherits the
broken statements.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from workerproc.store.sqlite import sql as sqlite_sql
from workerproc.store.sqlite import steps as sqlite_steps

try:
    from workerproc.store.postgres import sql as postgres_sql
    from workerproc.store.postgres import steps as postgres_steps
except ImportError:  # no psycopg: only SQLite can be broken (and tested)
    postgres_sql = postgres_steps = None  # type: ignore[assignment]

# SQLite's fence, as its queries spell it (``sqlite/queries/*.sql``: written out in each)
SQLITE_FENCE = """run_id = :run_id AND task_id = :task_id AND owner = :owner
    AND attempts = :attempt AND expires_at > :now"""

# each backend's fences, and what they are reduced to
SQLITE = {
    SQLITE_FENCE: "run_id = :run_id AND task_id = :task_id",
    # renew_many answers each lease by (task id, attempt): the broken one answers for the
    # attempt that asked, so a zombie hears "renewed" and goes on to write
    "RETURNING task_id, attempts, expires_at": "RETURNING task_id, :attempt, expires_at",
}
POSTGRES = (
    {}
    if postgres_sql is None
    else {
        postgres_sql._FENCE: "l.run_id = i.run_id AND l.task_id = i.task_id",
        # as on SQLite: the broken renewal answers for the attempt that asked
        "RETURNING l.task_id, l.attempts AS attempt": "RETURNING l.task_id, i.attempt AS attempt",
    }
)


def sources(backend: str = "sqlite") -> tuple[ModuleType, dict[str, Any]]:
    """Where a backend's statements live: its ``sql`` module and its catalogue."""
    if backend == "sqlite":
        return sqlite_sql, sqlite_steps.CATALOGUE
    assert postgres_sql is not None and postgres_steps is not None, "psycopg is not installed"
    return postgres_sql, postgres_steps.CATALOGUE


def unfenced_statements(backend: str = "sqlite") -> dict[str, str]:
    """Each fenced statement of a backend, by name, with the fence reduced."""
    fences = SQLITE if backend == "sqlite" else POSTGRES
    module, catalogue = sources(backend)
    found = {}
    for name, value in [*vars(module).items(), *catalogue.items()]:
        if name.isupper() and isinstance(value, str):
            broken = value
            for fence, weak in fences.items():
                broken = broken.replace(fence, weak)
            if broken != value:
                found[name] = broken
    # renew (one and many), the commit check, ack, release, hand-back, fail and both
    # compare-and-sets: if the store stops spelling its fences this way, say so instead of
    # silently testing a fenced store
    assert len(found) >= 8 and {"RENEW_MANY", "RENEW"} & set(found), sorted(found)
    return found


def disable_fencing() -> None:
    """Break fencing for the rest of this process (and every process it forks afterwards)."""
    for backend in ("sqlite", "postgres"):
        if backend == "postgres" and postgres_sql is None:
            continue
        module, catalogue = sources(backend)
        for name, sql in unfenced_statements(backend).items():
            if hasattr(module, name):
                setattr(module, name, sql)
            if isinstance(catalogue.get(name), str):
                catalogue[name] = sql
