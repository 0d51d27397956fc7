"""The claim's floor: where its walk of the claim index starts (docs/how-to/postgresql.md, "When
vacuum cannot run").

Runs end roughly in head order, so the dead entries of the claim index (runs_claim, runs_prio)
pile up at the oldest end of each level. While vacuum runs they are removed, or marked dead by
the first scan that meets them; while another client's snapshot holds the horizon back, none
can be, and a walk from the oldest end reads every run that ended since, a heap visit each:
at 200 runs/s, 12,000 more a minute, on every claim.

So each connection walks from a floor: a head time below which no live run was found. At most
every ``WALK_EVERY`` seconds it walks again (``FLOOR_NAMED``/``FLOOR_EVERY``: each served
queue's and level's first live entry, a run leased or not), and the claims in between walk
``head_at >= floor`` only. The walk goes up from the floor it had, never from the oldest end
(only a connection's first walk does): it reads the entries between the two floors, about a
second of arrivals, however long the dead prefix below has grown. The floor is also never later
than ``LAG`` seconds before the walk's "now": a transaction that wrote a run's head just before
and commits just after it is still met.

A run can still show up below the floor: its transaction stayed open longer than ``LAG``, or
its head was written earlier than the floor (a task written ahead by hand). A sweep meets it:
each walk also walks one piece of the index below the floor (``Sweep``), the pieces in turn,
from the oldest end up, each cut to about ``PIECE`` entries (live or dead, as read: the
server's own count of index entries returned); a live run met there lowers the floor to its
head. Such a run waits at most one round of the sweep: while vacuum runs, two or three walks
(the dead entries are gone, the pieces are few); while it is blocked, a walk per ``PIECE``
entries of the scope's dead prefix (at 200 runs/s, blocked 20 minutes: about 50 walks, 50 s),
as a run whose notification was lost waits for the idle poll. A clock that went back (an
injected test clock) starts over with a first walk at once.
"""

from __future__ import annotations

import math
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .fragments import CLOCK

if TYPE_CHECKING:
    from .tx import PostgresTx

WALK_EVERY = 1.0  # seconds between two walks of one connection's claim index (per scope)
LAG = 10.0  # the floor stays this far behind the walk's "now" at least
PIECE = 5000  # index entries one piece of the sweep reads, about (they are cut to it)
MAX_CUTS = 16  # a piece that read too many is cut into at most this many at once
MIN_SPAN = 0.01  # seconds of head time: a narrower piece is not cut (its runs share a head)


# the priority levels with a head at or above %(lo)s (the loose scan of the claim's ``levels``,
# from each level's newest end). Its own statement: while a queue is empty the newest entries
# are dead, and from a low bound it reads them all; a walk up from the floor asks from the
# floor, a piece of the sweep walks the levels the connection has seen (``Sweep.levels``: the
# levels from the oldest end are asked again once a round)
LEVELS = """WITH RECURSIVE levels(p) AS (
    SELECT (SELECT min(priority) FROM runs WHERE head_at >= %(lo)s::float8)
    UNION ALL
    SELECT (SELECT min(priority) FROM runs WHERE head_at >= %(lo)s::float8
            AND priority > levels.p)
    FROM levels WHERE levels.p IS NOT NULL)
SELECT coalesce(array_agg(p), '{}') FROM levels WHERE p IS NOT NULL"""
# the first live head in [%(lo)s, %(hi)s) of the named queues (%(queues)s), each queue's and
# level's (%(levels)s); and %(lag)s before now (NULL: no such bound): the floor is the lesser
FLOOR_NAMED = f"""SELECT min(f.head_at), {CLOCK} - %(lag)s
FROM unnest(%(queues)s::text[]) AS s(q) CROSS JOIN unnest(%(levels)s::int[]) AS lv(p)
CROSS JOIN LATERAL (SELECT r.head_at FROM runs AS r WHERE r.queue = s.q AND r.priority = lv.p
                    AND r.head_at >= %(lo)s::float8 AND r.head_at < %(hi)s::float8
                    ORDER BY r.head_at LIMIT 1) AS f"""
# the same for every queue: each level's
FLOOR_EVERY = f"""SELECT min(f.head_at), {CLOCK} - %(lag)s
FROM unnest(%(levels)s::int[]) AS lv(p)
CROSS JOIN LATERAL (SELECT r.head_at FROM runs AS r WHERE r.priority = lv.p
                    AND r.head_at >= %(lo)s::float8 AND r.head_at < %(hi)s::float8
                    ORDER BY r.head_at LIMIT 1) AS f"""
# the entries of the claim index this transaction's scans have read so far (live and dead)
READ = """SELECT pg_stat_get_xact_tuples_returned(to_regclass('runs_claim'))
    + pg_stat_get_xact_tuples_returned(to_regclass('runs_prio'))"""


@dataclass
class Sweep:
    """The index below the floor in pieces: ``[-inf, base)``, ``[base, cuts[0])``, ...,
    ``[cuts[-1], floor)``; ``read[i]``: the entries piece i read last (None: not yet);
    ``next``: the piece the next walk reads."""

    base: float  # piece 0's upper end: at first the connection's first floor
    cuts: list[float] = field(default_factory=list)
    read: list[int | None] = field(default_factory=lambda: [None, None])
    next: int = 0
    fresh: float = 0.0  # entries the floor passed since the top edge, about
    levels: set[int] = field(default_factory=set)  # every level a walk has met

    def passed(self, lo: float, at: float, end: float, read: int) -> None:
        """The floor went up from ``lo`` to ``at``, the walk reading ``read`` entries from
        ``lo`` to ``end`` (the first live head, or now): once about ``PIECE`` entries lie
        between the top edge and the floor, an edge goes there, so the top piece stays a
        piece however long a round of the sweep takes."""
        if at > lo and end > lo:
            self.fresh += read * (min(at, end) - lo) / (end - lo)
        top = self.cuts[-1] if self.cuts else self.base
        if self.fresh >= PIECE and at > top:  # as many edges as pieces it holds, evenly
            n = min(MAX_CUTS, math.ceil(self.fresh / PIECE))
            new = [c for c in (top + (at - top) * k / n for k in range(1, n)) if top < c < at]
            self.cuts += [*new, at]
            self.read[-1:] = [round(self.fresh / (len(new) + 1))] * (len(new) + 1) + [None]
            self.fresh = 0.0

    def bounds(self, at: float) -> tuple[float, float] | None:
        """Piece ``next``, cut at the floor ``at``; None once it lies above it."""
        edges = [-math.inf, self.base, *self.cuts]
        if self.next >= len(edges) or edges[self.next] >= at:
            return None
        hi = edges[self.next + 1] if self.next + 1 < len(edges) else math.inf
        return edges[self.next], min(hi, at)

    def measured(self, lo: float, hi: float, read: int, found: bool) -> None:
        """Piece ``next`` (``[lo, hi)``) read ``read`` entries: cut it if that was too many,
        join it to the next if both were few; then on to the next piece. (A piece where a live
        run was met read only up to it; runs started in one batch share a head time, and
        ``MIN_SPAN`` stops the cutting there.)"""
        i = self.next
        self.read[i] = read
        if i == len(self.read) - 1:  # the top piece, up to the floor
            self.fresh = 0.0
        if found or read <= PIECE // 2:
            if not found and i > 0 and i + 1 < len(self.read):
                after = self.read[i + 1]
                if after is not None and read + after < PIECE // 2:
                    del self.cuts[i - 1]  # the edge between pieces i and i + 1
                    del self.read[i + 1]
                    self.read[i] = read + after
        elif i == 0 and read > PIECE:
            self._below(read)
        elif read > PIECE and hi - lo > MIN_SPAN:
            n = min(MAX_CUTS, math.ceil(read / PIECE))
            new = [c for c in (lo + (hi - lo) * k / n for k in range(1, n)) if lo < c < hi]
            self.cuts[i - 1 : i - 1] = new  # the edges after lo (edge j is cuts[j - 2])
            self.read[i : i + 1] = [read // (len(new) + 1)] * (len(new) + 1)
            i += len(new)
        self.next = i + 1

    def _below(self, read: int) -> None:
        """Piece 0 (no lower end) read too many: the dead entries a connection opened while
        the horizon was held found below its first floor. Cut the pieces off its top, as many
        head seconds as the pieces above hold that many entries in (a minute, lacking them);
        the next rounds cut again where that guess was wrong."""
        above = [n for n in self.read[1 : len(self.cuts) + 1] if n is not None]  # both ends
        seconds = 60.0
        if sum(above) > 0 and self.cuts and self.cuts[-1] > self.base:
            seconds = read * (self.cuts[-1] - self.base) / sum(above)
        n = min(MAX_CUTS, math.ceil(read / PIECE))
        step = max(MIN_SPAN, seconds / n)
        new = [self.base - step * k for k in range(n, 0, -1)]
        self.cuts[0:0] = [*new[1:], self.base]
        self.base = new[0]
        self.read[0:1] = [None] * (n + 1)

    def restart(self) -> None:
        self.next = 0


@dataclass
class Floor:
    at: float  # no live run of its queues had its head below this at the walk
    now: float | None  # the injected clock of the walk (None: the database's)
    walked: float  # time.monotonic() of the walk
    sweep: Sweep


# per connection (its claims' own memory), per scope: the named queues, or None for all
_FLOORS: weakref.WeakKeyDictionary[Any, dict[tuple[str, ...] | None, Floor]] = (
    weakref.WeakKeyDictionary()
)


def _levels(tx: PostgresTx, lo: float) -> list[int]:
    row = tx.execute(LEVELS, {"lo": lo}).fetchone()
    return [] if row is None or row[0] is None else [int(p) for p in row[0]]


def _walk(tx: PostgresTx, queues: tuple[str, ...] | None, levels: list[int], lo: float,
          hi: float, lag: float | None) -> tuple[float | None, float | None]:  # fmt: skip
    """The first live head in ``[lo, hi)``, and now less ``lag`` (None: no lag)."""
    params: dict[str, Any] = {"now": tx.now, "lag": lag, "lo": lo, "hi": hi, "queues": None,
                              "levels": sorted(levels)}  # fmt: skip
    sql = FLOOR_EVERY
    if queues is not None:
        sql, params["queues"] = FLOOR_NAMED, list(queues)
    row = tx.execute(sql, params).fetchone()
    if row is None:
        return None, None
    return (None if row[0] is None else float(row[0]), None if row[1] is None else float(row[1]))


def _read(tx: PostgresTx) -> int:
    row = tx.execute(READ, {}).fetchone()
    return int(row[0]) if row is not None and row[0] is not None else 0


def floor(tx: PostgresTx, queues: tuple[str, ...] | None) -> float:
    """Where this claim's walk starts: the connection's floor for ``queues`` (None: every
    queue), walked again (up from where it was, and one piece of the sweep below it) when it
    is older than ``WALK_EVERY`` seconds."""
    mine = _FLOORS.setdefault(tx.connection, {})
    known, mono = mine.get(queues), time.monotonic()
    if known is not None and tx.now is not None and (known.now is None or tx.now < known.now):
        known = None  # a clock that went back: start over
    if known is not None and mono - known.walked < WALK_EVERY:
        return known.at
    if known is None:  # the connection's first walk: from the oldest end
        levels = _levels(tx, -math.inf)
        first, cap = _walk(tx, queues, levels, -math.inf, math.inf, LAG)
        at = min((x for x in (first, cap) if x is not None), default=-math.inf)
        mine[queues] = Floor(at, tx.now, mono, Sweep(at, levels=set(levels)))
        return at
    sweep = known.sweep
    levels = _levels(tx, known.at)  # from the floor: a bounded read even when all died
    sweep.levels.update(levels)
    read = _read(tx)
    first, cap = _walk(tx, queues, levels, known.at, math.inf, LAG)  # up from the floor
    at = min((x for x in (first, cap) if x is not None), default=known.at)
    now = cap + LAG if cap is not None else at
    before = _read(tx)
    sweep.passed(known.at, at, first if first is not None else now, before - read)
    piece = sweep.bounds(at)
    if piece is None:  # a round of the sweep is over: the next starts at the oldest end,
        sweep.restart()  # with every level there is now (a run below at a level of its own)
        sweep.levels.update(_levels(tx, -math.inf))
        piece = sweep.bounds(at)
    if piece is not None:
        lo, hi = piece
        # a live run below: walked from it (the levels of every run met so far)
        found, _ = _walk(tx, queues, sorted(sweep.levels), lo, hi, None)
        sweep.measured(lo, hi, _read(tx) - before, found is not None)
        if found is not None:
            at = min(at, found)
    mine[queues] = Floor(at, tx.now, mono, sweep)
    return at
