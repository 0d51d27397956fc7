"""A deliberately broken SQLite store, for the tests that must see fencing fail.

Test code only: ``disable_fencing()`` rewrites, in this process, every statement of the SQLite
backend that carries the fence (task id AND owner AND attempt AND a live lease) so that it only
asks "this task, not done yet". Any former holder may then renew, commit and ack: exactly the
zombie writes the chaos verifier must catch. Nothing in ``workerproc`` or ``supervisor`` knows
this module exists; a supervisor gets it by importing ``apps.chaos_unfenced`` as its app before
it forks, so every worker inherits the broken statements.
"""

from __future__ import annotations

from workerproc.store import sqlite_sql

UNFENCED = "id = :task_id AND done_at IS NULL"
UNFENCED_EACH = """id IN (SELECT json_extract(value, '$[0]') FROM json_each(:pairs))
    AND done_at IS NULL"""


def unfenced_statements() -> dict[str, str]:
    """Each fenced statement of the SQLite backend, by name, with the fence reduced."""
    fences = {sqlite_sql._FENCE: UNFENCED, sqlite_sql._FENCE_EACH: UNFENCED_EACH}
    found = {}
    for name, value in vars(sqlite_sql).items():
        if name.isupper() and isinstance(value, str):
            broken = value
            for fence, weak in fences.items():
                broken = broken.replace(fence, weak)
            if broken != value:
                found[name] = broken
    # renew (one and many), the commit check, ack, release, hand-back, fail and both
    # compare-and-sets: if the store stops spelling its fences this way, say so instead of
    # silently testing a fenced store
    assert len(found) >= 8 and "RENEW_MANY" in found, sorted(found)
    return found


def disable_fencing() -> None:
    """Break fencing for the rest of this process (and every process it forks afterwards)."""
    for name, sql in unfenced_statements().items():
        setattr(sqlite_sql, name, sql)
