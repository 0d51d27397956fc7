"""The outbox (B18), written once: every transition of a run writes one event in the
transaction that made it, and consumers read them in commit order.

A transition calls ``emit`` (one line) where it happened; the events wait on the ``Tx`` and the
dialect writes them all in one statement (``INSERT_EVENTS``) just before COMMIT
(``Tx.flush``): a transaction that rolls back wrote none, a refused write wrote only its
refusal. A producer's program (``producers.inserting``, run by the sync and the async store)
yields its ``INSERT_EVENTS`` itself (``inserted``).

Commit order: on SQLite the single writer hands out ids in commit order as it writes them.
On PostgreSQL an id drawn while writing could commit after a larger one, so events are written
unnumbered and a reader numbers the committed ones first (``sequencing``): under one advisory
lock, in one transaction that commits before the lock is let go, so every number handed out is
larger than every number any reader has seen (docs/protocol.md, B18).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from ..asks import EventRow, EventsAsk
from ..codec import QUEUE_NAME, shown
from ..dialect import Dialect, Params, Tx
from ..errors import InvalidOption
from ..types import JSON, Event
from .programs import Program, drive
from .reads import below

# The transitions that write an event (the lead adds waits, signals, schedules ... here).
KINDS = frozenset(
    {
        "run.enqueued", "run.succeeded", "run.failed", "run.cancelled", "run.retried",
        "step.claimed", "lease.taken_over", "step.committed", "step.released",
        "step.handed_back", "write.refused", "run.waiting", "run.signalled", "step.batched",
        "run.forked", "step.migrated",
    }
)  # fmt: skip
SEQUENCE_BATCH = 10_000  # events a reader numbers at most per pass (PostgreSQL)
MAX_LIMIT = 10_000  # events one read answers at most
DEFAULT_POLL = 1.0  # a follower looks again at least this often (a notification may not come)
_encode = json.JSONEncoder(separators=(",", ":")).encode  # one encoder: made once, not per event


def emit(
    tx: Tx, kind: str, run_id: int | None, task: str | None = None, attempt: int | None = None,
    **data: JSON,
) -> None:  # fmt: skip
    """One event of ``kind`` for the transition ``tx`` is making, written with it."""
    tx.events.append(event_row(kind, run_id, task, attempt, data))


def event_row(
    kind: str, run_id: int | None, task: str | None, attempt: int | None, data: dict[str, JSON]
) -> Params:
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}")
    if not data:  # the hot path's run.succeeded, step.committed: nothing to encode
        text = "{}"
    else:
        text = _encode(data if None not in data.values() else
                       {k: v for k, v in data.items() if v is not None})  # fmt: skip
    return {"run_id": run_id, "kind": kind, "task": task, "attempt": attempt, "data": text}


def inserted(events: list[Params], now: float | None) -> Program[None]:
    """A program's own events, written in its transaction (a producer's start)."""
    if events:
        yield "INSERT_EVENTS", {"events": events, "now": now}


def sequencing() -> Program[int]:
    """PostgreSQL: number the committed, unnumbered events in order, under the events lock;
    how many it numbered."""
    yield "LOCK_EVENTS", {}
    rows = yield "SEQUENCE_EVENTS", {"limit": SEQUENCE_BATCH}
    return len(rows)


def check_consumer(name: object) -> str:
    """A consumer's name: 1-64 characters of ``[A-Za-z0-9_.:-]``."""
    if not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
        raise InvalidOption(
            f"a consumer's name must be 1-64 characters of letters, digits and _.:- "
            f"(got {shown(name)})"
        )
    return name


def check_position(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise InvalidOption(f"{what} must be an event id, an integer >= 0 (got {shown(value)})")
    return value


def not_past_newest(position: int, ordered: bool, what: str) -> Program[int]:
    """Refuse (``InvalidOption``) a cursor ``position`` above the newest committed event: a
    cursor past it would skip, for ever, the events that take those ids later. The newest
    id; on PostgreSQL (``ordered`` False) the committed events are numbered first, but only
    when the position is above the newest numbered one (the common case reads one row)."""
    rows = yield "LAST_EVENT", {}
    newest = int(rows[0][0]) if rows else 0
    if position > newest and not ordered:
        yield from sequencing()
        rows = yield "LAST_EVENT", {}
        newest = int(rows[0][0]) if rows else 0
    if position > newest:
        raise InvalidOption(
            f"{what} {position} is past the newest event ({newest}): a cursor there would "
            "skip the events that take those ids"
        )
    return newest


def acking(name: object, upto: object, ordered: bool, now: float | None) -> Program[int]:
    """``consumer`` ``name`` acknowledged every event up to ``upto``: its cursor moves there,
    never back and never past the newest event; where it stands now."""
    consumer, position = check_consumer(name), check_position(upto, "upto")
    yield from not_past_newest(position, ordered, "upto")
    rows = yield "ACK_EVENTS", {"name": consumer, "upto": position, "now": now}
    return int(rows[0][0])


def reading(after: int, limit: int, run: int | None, system: bool = False) -> EventsAsk:
    """The ask that reads up to ``limit`` events after ``after`` (of run ``run``; else the
    users' runs' only, unless ``system``: the system's runs' too, B20): the driver's
    ``read_events``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidOption(f"limit must be from 1 to {MAX_LIMIT} (got {shown(limit)})")
    after = check_position(after, "after")
    if run is None:
        return EventsAsk(after, limit, below=below(system))
    return EventsAsk(after, limit, run=check_position(run, "run"))


def event_of(row: EventRow) -> Event:
    decoded: Any = json.loads(row.data) if row.data else {}
    return Event(int(row.id), float(row.at), row.run_id, row.kind, row.task, row.attempt,
                 decoded)  # fmt: skip


class Events:
    """Reading the outbox: from a cursor of the caller's, or a named consumer's cursor kept in
    the database, which moves only when the consumer acknowledges (``ack_events``)."""

    dialect: Dialect

    def events(
        self, after: int | None = None, limit: int = 500, *, consumer: str | None = None,
        run: int | None = None, system: bool = False,
    ) -> list[Event]:  # fmt: skip
        """Up to ``limit`` events with ids above ``after`` (0: from the first), in commit
        order; with ``consumer`` (and no ``after``), above that consumer's acknowledged
        position (a new consumer starts at 0 and is kept from then on). ``run``: that
        run's events only. The system's own runs' events (the webhooks' deliveries, B20) are
        left out unless ``system`` (or their ``run`` is named). Reading moves no cursor:
        ``ack_events`` does."""
        if consumer is not None and after is None:
            after = self.consumer_position(consumer)
        ask = reading(0 if after is None else after, limit, run, system)
        if not self.dialect.ordered_events:
            self.dialect.write(lambda tx: drive(sequencing(), tx))
        return [event_of(row) for row in self.dialect.read(lambda tx: tx.read_events(ask))]

    def last_event_id(self) -> int:
        """The newest committed event's id (0: none yet): ``follow(after=...)`` from it yields
        only the events that commit from now on."""
        if not self.dialect.ordered_events:
            self.dialect.write(lambda tx: drive(sequencing(), tx))
        row = self.dialect.read(lambda tx: tx.one("LAST_EVENT", {}))
        return int(row[0]) if row is not None else 0

    def events_mark(self) -> int:
        """A number that differs whenever an event committed since it was read, without the
        numbering ``last_event_id`` writes on PostgreSQL (a read only: -1 while a committed
        event waits for its number, else the newest number). What the webhooks' waker reads
        between its looks."""
        row = self.dialect.read(lambda tx: tx.one("EVENTS_MARK", {}))
        return int(row[0]) if row is not None else 0

    def consumer_position(self, consumer: str) -> int:
        """Where ``consumer`` stands: the last event id it acknowledged (a new one: 0, kept)."""
        params = {"name": check_consumer(consumer)}
        row = self.dialect.read(lambda tx: tx.one("CONSUMER_AT", params))
        return int(row[0]) if row is not None else self.ack_events(consumer, 0)

    def ack_events(self, consumer: str, upto: int) -> int:
        """``consumer`` has handled every event up to id ``upto``: its cursor moves there
        (never back); where it stands now. ``InvalidOption`` for an id above the newest
        event (the cursor would skip the events that take those ids)."""
        ordered = self.dialect.ordered_events
        return self.dialect.write(lambda tx: drive(acking(consumer, upto, ordered, tx.now), tx))

    def drop_consumer(self, consumer: str) -> bool:
        """Forget a consumer (its cursor no longer holds events back from ``prune``)."""
        params = {"name": check_consumer(consumer)}
        return bool(self.dialect.write(lambda tx: tx.count("DROP_CONSUMER", params)))

    def follow(
        self, after: int | None = None, *, consumer: str | None = None, run: int | None = None,
        limit: int = 500, poll: float = DEFAULT_POLL, system: bool = False,
        watch: Callable[[], object] | None = None,
    ) -> Iterator[Event]:  # fmt: skip
        """Every event after ``after`` (or ``consumer``'s position), then each new one as it
        commits, for ever: sleeps on the change token between reads (at most ``poll``
        seconds), never spins. Acknowledging stays the consumer's (``ack_events``).
        ``system``: as ``events``. ``watch``: called before every read (at least every
        ``poll`` seconds): what it raises ends the follow (``supervisor events --follow``
        checks there that the database file is still the one it opened)."""
        cursor = self.consumer_position(consumer) if after is None and consumer else after or 0
        while True:
            if watch is not None:
                watch()
            token = self.dialect.change_token()
            batch = self.events(cursor, limit, run=run, system=system)
            yield from batch
            if batch:
                cursor = batch[-1].id
            if len(batch) < limit:
                self.dialect.wait_change(token, poll)


def prune_events(dialect: Dialect, older_than: float, batch: int, force: bool) -> int:
    """Delete events older than ``older_than`` seconds, never one a named consumer has not
    acknowledged or a webhook has not delivered (unless ``force``) and never the newest (ids
    count on from it), ``batch`` per transaction; how many went."""
    params = {"age": float(older_than), "limit": int(batch), "force": bool(force)}
    total = 0
    while (n := dialect.write(lambda tx: tx.count("PRUNE_EVENTS", {**params, "now": tx.now}))) > 0:
        total += n
    return total
