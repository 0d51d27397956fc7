"""What the protocol (``store/protocol/``) needs from a database engine: a small ``Dialect``.

The protocol decides (who may write, what a refusal means, which run fails); a dialect only
runs what the protocol names, on its engine:

- ``write`` and ``read`` run a function in a transaction, with one contract on every engine:
  the function gets a ``Tx``, runs named statements through it, and its result is returned
  once the transaction committed. ``tx.now`` is the "now" parameter every statement gets: a
  number read once the transaction holds its write lock (SQLite), or None when the
  statements read the database clock themselves, after their own locks (PostgreSQL in
  production; an injected clock is read after the locks too).
- Named statements: every backend's catalogue defines exactly the names of ``STATEMENTS``
  (``tests/store/test_store_catalogue.py`` says so). A catalogue maps a name to its SQL (a named
  query of the backend's ``queries/*.sql``, loaded and checked by ``store.queries``, or a
  statement of its ``sql`` module), or to a *step*: a few lines of Python for a logical step
  that is several statements on that engine (SQLite's ``FINISH`` is a compare-and-set, then
  the task marked done) or whose parameters the engine takes in another shape (a JSON array on
  SQLite, an array on PostgreSQL).
- Completions (``FINISH``, ``ADVANCE``, ``RELEASE``, ``HANDBACK``, ``ACK``, ``SET_STATE``: the
  driver's ``complete``) take a batch of N >= 1 commits of distinct runs (``commits``: each
  one's record, ``driver.Completion``) and answer a row per commit written: the dialect
  decides how they go (PostgreSQL: one statement, the commits as a VALUES list; SQLite: each
  in turn, in process).
  ``Tx.many``: one statement for each of many parameter sets (PostgreSQL: one round trip).
- The change token and ``wait_change`` (idle workers and ``wait``), migrations, the engine's
  own storage check.
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple, Protocol, TypeVar

from .readiness import readable
from .records import record
from .verbs import InTurn

if TYPE_CHECKING:
    from .types import RunFailure

T = TypeVar("T")
Params = dict[str, Any]
Row = tuple[Any, ...]
Step = Callable[[Any, Params], list[Row]]  # (the backend's Tx, parameters) -> rows
Catalogue = Mapping[str, str | Step]


class ClaimRow(NamedTuple):
    """One row of a claim (``CLAIM``, ``CLAIM_QUEUES``, ``CLAIM_OTHERS``, ``CLAIM_TASK``,
    ``CLAIM_RUNS``), as every dialect builds it from its statement's columns
    (``protocol.claims`` reads it).
    ``task_id`` None: a run the statement locked but could not lease. JSON goes as text
    (``payload``, ``state``, ``options``: the task's declared options, None: none declared)."""

    task_id: int | None
    run_id: int
    name: str | None
    payload: str | None
    attempts: int
    attempt_base: int
    expires_at: float
    takeover: bool
    claimed_at: float
    state: str | None
    revision: int
    queue: str
    options: str | None
    signal_id: int | None  # the signal that resumed the task's wait (B14)
    parent_id: int | None  # the run's parent (its end is counted there)
    join_task: int | None  # the task that joins the run's children
    gate_a: str | None = None  # the gates a gated claim's lease holds a slot of
    gate_b: str | None = None
    gate_c: str | None = None
    reserved: int | None = None  # the tokens its claim reserved from them
    traceparent: str | None = None  # the run's W3C trace context
    given_back: int | None = None  # what a taken-over lease's reservation gives back
    version: int | None = None  # the claimed task's version (None: unversioned, B25)


# What a write is, for a dialect that treats some writes apart: a worker's exchange (commits
# and claims), a producer's start, one idempotent statement that locks what it needs itself
# (a renewal), or anything else.
Intent = Literal["write", "exchange", "start", "statement", "call"]
# a run became claimable; a watched run ended; a run's stream was written (the async store's
# followers only: no sync listener hears it, so idle workers never wake for a stream)
Channel = Literal["work", "end", "stream"]

# How often a polled change token is read (SQLite's ``PRAGMA data_version``, a cheap local
# read): the idle worker's pickup latency, and ``wait`` on SQLite, where no ``ChangeWatch``
# says when to look. With one, the token is still read this often at least (a safety net: a
# watch is a hint).
CHANGE_CHECK = 0.005
WATCHED_CHECK = 0.5
# After a watch saw a write, the token is polled for this long: the write may be a commit still
# on its way (SQLite marks a commit done in its shared-memory index, which no watch sees).
SETTLE = 0.05


class ChangeWatch(Protocol):
    """A descriptor that becomes readable when another connection may have committed (SQLite:
    an inotify watch of the database's files; PostgreSQL: the LISTEN connection's socket), so
    a waiter sleeps on it instead of polling the change token. Only a hint: the token decides."""

    def fileno(self) -> int | None:
        """The descriptor to sleep on now (None: none at the moment; poll the token)."""

    def drain(self) -> bool:
        """Consume what made it readable; whether the token may have moved."""


# The protocol's vocabulary: every name it runs through a Tx, defined by every catalogue.
STATEMENTS = frozenset(
    {
        # claims (R1, R6, B10)
        "CLAIM", "CLAIM_QUEUES", "CLAIM_OTHERS", "DROP_EXHAUSTED_LEASE", "FAIL_RUN",
        "ATTEMPT_ENDED", "CLAIM_TASK",
        # renewals (R3, B5)
        "RENEW_MANY",
        # fenced commits (R2, R5, B3, B4) and the completions (batches of N >= 1 of the
        # driver's ``complete``; ``ACK``, ``SET_STATE``: the pinned ack and compare_and_set)
        "CHECK_FENCE", "INSERT_REJECTION", "FINISH", "ADVANCE", "RELEASE", "HANDBACK", "ACK",
        "SET_STATE", "TASK_DONE", "TASK_FAILED", "SET_VERSION",
        # producers (B7)
        "INSERT_RUNS", "FIND_BY_KEYS",
        # debounced starts: the key's run takes the new payload, or goes on without its key
        "LOCK_KEY", "KEY_RUN", "DEBOUNCE_RUN", "RELEASE_KEY",
        # operators (B1, B2)
        "RUN_STATUS", "CANCEL_RUN", "PENDING_TASKS", "RETRY_RUN", "ATTEMPTS_DROPPED_BY_RETRY",
        "RETRY_TASKS", "RELEASE_OWNER", "PRUNE_RUNS", "PRUNE_REJECTIONS",
        # a fork: a new run from a run's step (B24)
        "FORK_SOURCE",
        # bulk operations: the runs a filter matches, in id order, a batch at a time
        "RUNS_MATCHING",
        # finished runs counted as they end (stats reads no finished run)
        "COUNT_ENDED", "RUN_TOTALS",
        # the worker processes of every host, kept by their heartbeats
        "WORKER_SEEN", "WORKER_GONE", "PRUNE_WORKERS", "LIST_WORKERS", "HEAD_TASKS",
        "PENDING_IDS",
        # flow control: limits, their gates, the gated claim and its settling
        "LIMIT_SPECS", "LIMIT_ROWS", "DECLARE_LIMIT", "SET_LIMIT", "LIMIT_KEYS", "LIMIT_USE",
        "OPEN_GATES", "GATE_STATE", "LINE_RUNS", "LINE_NEXT", "CLAIM_RUNS", "GATE_WRITE",
        "GATE_SETTLE", "PLACE_GATES", "UNSPEND", "REGATE", "REOPEN_RUN", "LINES_WAITING",
        "REOPEN_GATES",
        # reads
        "GET_RUN", "GET_TASKS", "GET_TASK", "LIST_RUNS", "LIST_REJECTIONS",
        "SUPERSEDED_COMMITS", "OVERLAPPING_LEASES", "RUN_COUNTS", "TASK_COUNTS", "LIVE_LEASES",
        "NEXT_READY", "NEXT_READY_QUEUES",
        # the dashboard's reads (a page's filters are optional parameters of one statement)
        "RUNS_BEFORE", "RUNS_AFTER", "TASK_NAMES", "ATTEMPT_HISTORY", "RUN_REJECTIONS",
        "FINISHED_SINCE", "FAILED_SINCE",
        # per-task options (B11)
        "TASK_OPTIONS", "SET_TASK_OPTIONS", "DROP_TASK_OPTIONS",
        # schedules (B16): declared, fired by compare-and-set on next_at, read
        "SCHEDULE_ROWS", "DECLARE_SCHEDULE", "DROP_SCHEDULE", "SCHEDULE_ROW", "SCHEDULE_FIRE",
        "SCHEDULES_DUE", "NEXT_SCHEDULE",
        # paid calls (B13): kept the moment they return, reused by the step's next attempt
        "FIND_CALL", "COUNT_REUSE", "KEEP_CALL", "CALL_LOSER", "RUN_CALLS", "FORGET_CALL",
        "CALL_TOTALS",
        # ... and recorded before they are made: intents, parked calls, resolve, usage
        "EARLIER_INTENTS", "INSERT_INTENT", "ANSWER_INTENT", "KEPT_ANSWER", "INSERT_USAGE",
        "MARK_PARKED", "UNPARK", "CALL_TO_RESOLVE", "SETTLE_INTENTS", "RESOLVE_CALL",
        "RUN_INTENTS", "INTENT_TOTALS", "RUN_INTENT_COUNTS", "SPEND_BY_TASK", "SPEND_BY_FIELD",
        "FORGET_INTENTS", "STORE_IDENTITY", "LOCK_CALL",
        # the outbox (B18): events, their commit order, named consumers, retention
        "INSERT_EVENTS", "TAKEN_FROM", "LOCK_EVENTS", "SEQUENCE_EVENTS", "LIST_EVENTS",
        "LIST_RUN_EVENTS", "LAST_EVENT", "EVENTS_MARK", "CONSUMER_AT", "ACK_EVENTS",
        "DROP_CONSUMER", "PRUNE_EVENTS",
        # runs that wait (B14): the wait commit, signals kept and delivered once
        "MARK_WAIT", "INSERT_SIGNAL", "DELIVER_SIGNAL", "GET_SIGNAL", "RUN_SIGNALS",
        # child runs (B14): spawned in the parent's commit, joined when the last one ends
        "LINK_CHILDREN", "CHILD_ENDED", "JOIN_DUE", "CHILD_RETRIED", "CHILDREN_OF",
        "CANCEL_DESCENDANTS", "RUN_CHILDREN",
        # webhooks (B20): declared by operators, delivered by their delivery runs
        "WEBHOOK_ROWS", "WEBHOOK_ROW", "WEBHOOK_ADD", "WEBHOOK_DROP", "WEBHOOK_PARKED",
        "WEBHOOK_SIGNALS_DONE", "WEBHOOK_MOVE", "WEBHOOK_BACKLOG", "WEBHOOK_DUE",
        # runs' streams (B21): chunks written in batches under the fence, read in order
        "STREAM_HEAD", "STREAM_FENCE", "STREAM_MOVE", "STREAM_MOVED",
        "STREAM_READ", "STREAM_STEP", "STREAM_EXPIRED", "STREAM_DROP", "STREAM_STATUS",
    }
)  # fmt: skip


@record
class Shaped:
    """A step that is one statement whose parameters take another shape on its engine (lists
    as arrays, say): callable as any step, and readable by a transaction that is not a ``Tx``
    (the async store sends ``statement(prefix)`` with ``shape(params)`` itself)."""

    statement: Callable[[str], str]  # the SQL, for a schema prefix ("" on our connections)
    shape: Callable[[Params], Params]

    def __call__(self, tx: Any, params: Params) -> list[Row]:
        cur = tx.execute(self.statement(tx.prefix), self.shape(params))
        rows: list[Row] = [] if cur.description is None else cur.fetchall()
        return rows


def catalogue(modules: Sequence[object], steps: Mapping[str, Step]) -> dict[str, str | Step]:
    """A backend's catalogue: for every name of ``STATEMENTS``, its step, or else the SQL
    constant of that name in ``modules`` (a name found nowhere stays out: the catalogue test
    names it)."""
    found: dict[str, str | Step] = {}
    for name in STATEMENTS:
        if name in steps:
            found[name] = steps[name]
            continue
        for module in modules:
            sql = getattr(module, name, None)
            if isinstance(sql, str):
                found[name] = sql
                break
    return found


class Cursor(Protocol):
    """What a DB-API cursor answers (sqlite3 and psycopg alike)."""

    @property
    def description(self) -> object: ...
    @property
    def rowcount(self) -> int: ...
    def fetchall(self) -> list[Any]: ...
    def fetchone(self) -> Any: ...


class Tx(InTurn):
    """One transaction in progress (or one read): runs the catalogue's statements by name, and
    offers the driver's verbs (``driver.Driver``, implemented over its statements in turn:
    ``verbs.InTurn``)."""

    catalogue: ClassVar[Catalogue]
    now: float | None  # the "now" parameter of every statement (see the module's docstring)
    events: list[Params]  # what this transaction's transitions emitted, for ``flush`` (B18)
    # the runs this transaction failed, in order: kept apart from ``events``, which an engine
    # may write (and empty) in the middle of the transaction (``open_gates``)
    failed: list[RunFailure]

    def __init__(self, now: float | None) -> None:
        self.now = now
        self.events = []
        self.failed = []
        self.deferred = []
        self.ahead = []

    def flush(self) -> None:
        """Write what waits for the COMMIT (the gate writes held back), then the events this
        transaction's transitions emitted (``protocol.events.emit``), all in one statement,
        inside the transaction: the dialect calls it before COMMIT."""
        self._write_deferred()
        if self.events:
            events, self.events = self.events, []
            self.count("INSERT_EVENTS", {"events": events, "now": self.now})

    @abc.abstractmethod
    def execute(self, sql: str, params: Params) -> Cursor:
        """Run one SQL statement of this backend (a catalogue's, or a step's part)."""

    @abc.abstractmethod
    def time(self) -> float:
        """The moment this transaction stands at, as a number (``now`` when it is one)."""

    def rows(self, name: str, params: Params) -> list[Row]:
        entry = self.catalogue[name]
        if isinstance(entry, str):
            return self.execute(entry, params).fetchall()
        return entry(self, params)

    def one(self, name: str, params: Params) -> Row | None:
        entry = self.catalogue[name]
        if isinstance(entry, str):
            row: Row | None = self.execute(entry, params).fetchone()
            return row
        rows = entry(self, params)
        return rows[0] if rows else None

    def count(self, name: str, params: Params) -> int:
        """Rows the statement changed (a statement that returns rows: one per row changed)."""
        entry = self.catalogue[name]
        if not isinstance(entry, str):
            return len(entry(self, params))
        cur = self.execute(entry, params)
        return cur.rowcount if cur.description is None else len(cur.fetchall())

    def rows_each(self, calls: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        """``rows(name, params)`` for each call, in order; a dialect may send them in one round
        trip (PostgreSQL: one query, whose statements the server runs in order, each after the
        locks of the one before and, in READ COMMITTED, each reading with a snapshot of its
        own, taken when it begins)."""
        return self._each(calls)

    def many(self, name: str, each: Sequence[Params]) -> list[int]:
        """``count`` for each parameter set, in order (a dialect may send them at once)."""
        entry = self.catalogue[name]
        if not isinstance(entry, str):
            return [len(entry(self, params)) for params in each]
        return [self.count(name, params) for params in each]


class Dialect(abc.ABC):
    """One database engine under the protocol. ``url`` opens the same database again;
    ``where`` is what messages may show of it (no password)."""

    url: str
    where: str
    # B18: event ids are handed out in commit order as they are written (one writer at a
    # time); False: ``SEQUENCE_EVENTS`` numbers committed events, in order, before a read
    ordered_events: ClassVar[bool] = True

    @abc.abstractmethod
    def migrate(self) -> None:
        """Create the schema or bring it forward (refusing a newer one, or what is not ours)."""

    @abc.abstractmethod
    def write(
        self, fn: Callable[[Tx], T], *, runs: Iterable[int] = (), intent: Intent = "write",
        caller: object = None,
    ) -> T:  # fmt: skip
        """``fn`` in one write transaction; ``runs``: the runs it will write (a dialect with
        row locks locks them first, in id order; one without never reads them). With
        ``caller``, the caller's own open transaction on the same database instead: it
        commits or rolls back, not us."""

    @abc.abstractmethod
    def read(self, fn: Callable[[Tx], T], *, snapshot: bool = False) -> T:
        """``fn`` without the write lock; with ``snapshot``, every statement in one snapshot."""

    @abc.abstractmethod
    def now(self) -> float:
        """The store's clock (injectable; the database clock on PostgreSQL)."""

    @abc.abstractmethod
    def change_token(self, channel: Channel | None = None) -> int:
        """A number that changes when another connection commits (on ``channel``; None: any).
        Cheap; never the write lock."""

    def wait_change(self, token: int, timeout: float, channel: Channel | None = None) -> int:
        """Sleep until the change token differs from ``token`` or ``timeout`` passes; return
        the current token. Here by sleeping on ``change_watch`` (or, without one,
        polling every ``CHANGE_CHECK``); a dialect with notifications sleeps on them."""
        deadline = time.monotonic() + timeout
        watch = self.change_watch()
        hot_until = 0.0
        while (current := self.change_token(channel)) == token and time.monotonic() < deadline:
            left = max(0.0, deadline - time.monotonic())
            fd = None if watch is None else watch.fileno()
            if watch is None or fd is None:
                time.sleep(min(CHANGE_CHECK, left))
                continue
            step = CHANGE_CHECK if time.monotonic() < hot_until else WATCHED_CHECK
            with contextlib.suppress(OSError, ValueError):  # (closed meanwhile: look again)
                readable((fd,), min(step, left))
            if watch.drain():
                hot_until = time.monotonic() + SETTLE
        return current

    def change_watch(self) -> ChangeWatch | None:
        """What a waiter may sleep on instead of polling ``change_token`` (None: poll it every
        ``CHANGE_CHECK``). This process's own; one thread waits on it at a time."""
        return None

    def commits_move_token(self) -> bool:
        """Whether every commit of another connection moves ``change_token`` (SQLite: its
        ``data_version``). False where only some commits notify (PostgreSQL's LISTEN: new work
        and watched runs' ends): a waiter for anything else must read it now and then."""
        return True

    def watch(self, run_id: int) -> None:  # noqa: B027 - most engines need nothing
        """Before ``wait`` sleeps on the ``end`` channel: make the run's end move it."""

    def claimed(self) -> None:  # noqa: B027 - most engines need nothing
        """A claim handed out leases: a dialect that listens while idle may stop."""

    @abc.abstractmethod
    def storage_check(self, quick: bool = False) -> str | None:
        """What ``check_storage`` runs, named for people; None when this database offers no
        check of its storage (``check_storage`` then checks nothing and finds nothing)."""

    @abc.abstractmethod
    def check_storage(self, quick: bool = False, limit: int = 100) -> list[str]:
        """What the engine finds wrong with its own storage, at most ``limit`` lines; empty
        when sound. Corruption is reported, never raised."""

    @abc.abstractmethod
    def close(self) -> None: ...
