"""The claim's floor: where its walk of the claim index starts (docs/how-to/postgresql.md, "When
vacuum cannot run").

Runs end roughly in head order, so the dead entries of the claim index (runs_claim, runs_prio)
pile up at the oldest end of each level. While vacuum runs they are removed, or marked dead by
the first scan that meets them; while another client's snapshot holds the horizon back, none
can be, and a walk from the oldest end reads every run that ended since, a heap visit each:
at 200 runs/s, 12,000 more a minute, on every claim.

So each connection walks from a floor: a head time below which no live run was found. A full
walk (``FLOOR_NAMED``/``FLOOR_EVERY``: each served queue's and level's first live entry, a
run leased or not) reads the dead prefix once, at most every ``FULL_EVERY`` seconds; the claims
in between walk ``head_at >= floor`` only. The floor is also never later than ``LAG`` seconds
before the full walk's "now": a transaction that wrote a run's head just before and commits
just after it is still met. A run that shows up below the floor otherwise (its transaction
stayed open longer than ``LAG``, or its head was written earlier than the floor: a task
written ahead by hand) is met by the next full walk, at most ``FULL_EVERY`` seconds later;
until then it waits, as a run whose notification was lost waits for the idle poll. A clock
that went back (an injected test clock) walks in full at once.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .fragments import CLOCK

if TYPE_CHECKING:
    from .tx import PostgresTx

FULL_EVERY = 1.0  # seconds between two full walks of one connection's claim index
LAG = 10.0  # the floor stays this far behind the full walk's "now" at least

# the priority levels with a head in the claim index (the loose scan of the claim's ``levels``)
_LEVELS = """WITH RECURSIVE levels(p) AS (
    SELECT (SELECT min(priority) FROM runs WHERE head_at IS NOT NULL)
    UNION ALL
    SELECT (SELECT min(priority) FROM runs WHERE head_at IS NOT NULL AND priority > levels.p)
    FROM levels WHERE levels.p IS NOT NULL)"""
# the floor of the named queues (%(queues)s): each queue's and level's first live head (runs_claim)
FLOOR_NAMED = f"""{_LEVELS}
SELECT least(min(f.head_at), {CLOCK} - %(lag)s)
FROM unnest(%(queues)s::text[]) AS s(q) CROSS JOIN levels AS lv
CROSS JOIN LATERAL (SELECT r.head_at FROM runs AS r WHERE r.queue = s.q AND r.priority = lv.p
                    AND r.head_at IS NOT NULL ORDER BY r.head_at LIMIT 1) AS f
WHERE lv.p IS NOT NULL"""
# the floor of every queue: each level's first live head (runs_prio)
FLOOR_EVERY = f"""{_LEVELS}
SELECT least(min(f.head_at), {CLOCK} - %(lag)s)
FROM levels AS lv
CROSS JOIN LATERAL (SELECT r.head_at FROM runs AS r WHERE r.priority = lv.p
                    AND r.head_at IS NOT NULL ORDER BY r.head_at LIMIT 1) AS f
WHERE lv.p IS NOT NULL"""


@dataclass
class Floor:
    at: float  # no live run of its queues had its head below this at the full walk
    now: float | None  # the injected clock of the full walk (None: the database's)
    walked: float  # time.monotonic() of the full walk


# per connection (its claims' own memory), per scope: the named queues, or None for all
_FLOORS: weakref.WeakKeyDictionary[Any, dict[tuple[str, ...] | None, Floor]] = (
    weakref.WeakKeyDictionary()
)


def floor(tx: PostgresTx, queues: tuple[str, ...] | None) -> float:
    """Where this claim's walk starts: the connection's floor for ``queues`` (None: every
    queue), walked again in full when it is older than ``FULL_EVERY`` seconds."""
    mine = _FLOORS.setdefault(tx.cur.connection, {})
    known, mono = mine.get(queues), time.monotonic()
    if (
        known is not None
        and mono - known.walked < FULL_EVERY
        and (tx.now is None or (known.now is not None and tx.now >= known.now))
    ):
        return known.at
    params: dict[str, Any]
    sql, params = FLOOR_EVERY, {"now": tx.now, "lag": LAG, "queues": None}
    if queues is not None:
        sql, params["queues"] = FLOOR_NAMED, list(queues)
    row = tx.execute(sql, params).fetchone()
    at = float(row[0]) if row is not None and row[0] is not None else float("-inf")
    mine[queues] = Floor(at, tx.now, mono)
    return at
