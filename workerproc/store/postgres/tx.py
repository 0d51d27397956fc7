"""A PostgreSQL transaction under the protocol (``PostgresTx``) and its COMMIT: statements
prepared once per session; several statements sent in one round trip as one query of
``EXECUTE``s of statements the session prepared (``Batch``). This is where the gates' verbs
(``store/driver.py``) are given their round trips: ``many``; the gate writes held back, sent
with ``OPEN_GATES``, its clock and the reads of the gates they settled (``_gates_then``);
``look_gates``'s reads together (``_each``); the write-back and the events with the COMMIT
(``commit``); the transaction's BEGIN with its first batch, or its COMMIT's query
(``PostgresTx.begin``)."""

from __future__ import annotations

import re
import weakref
import zlib
from collections.abc import Sequence
from functools import cache
from typing import Any, ClassVar

import psycopg

from ..dialect import Catalogue, Params, Row, Shaped, Tx
from ..driver import Opened, by_line
from ..records import record
from ..verbs import Calls, GatesRead
from . import gates_sql as g
from .ops_sql import NOW
from .sql import LOCK_RUNS
from .steps import CATALOGUE

Cursor = psycopg.Cursor[Any]


# ``INSERT_EVENTS``'s values, in the order of the session's prepared statement, and their types
_EVENTS_VALUES = (("run_ids", "bigint[]"), ("kinds", "text[]"), ("tasks", "text[]"),
                  ("attempts", "int[]"), ("datas", "text[]"), ("now", "float8"))  # fmt: skip


def _insert_events_prepared() -> str:
    """``INSERT_EVENTS`` as a prepared statement of the session (its values as $1 ... $6)."""
    entry = CATALOGUE["INSERT_EVENTS"]
    assert isinstance(entry, Shaped)
    text = entry.statement("")
    for k, (name, _) in enumerate(_EVENTS_VALUES, start=1):
        text = text.replace(f"%({name})s", f"${k}")
    types = ", ".join(kind for _, kind in _EVENTS_VALUES)
    return f"PREPARE {_EVENTS_STATEMENT} ({types}) AS {text}"


_EVENTS_STATEMENT = "leasekeeper_insert_events_columns"
_PREPARE_EVENTS = _insert_events_prepared()
_EXECUTE_EVENTS = (f"EXECUTE {_EVENTS_STATEMENT} "
                   f"({', '.join(f'%({name})s' for name, _ in _EVENTS_VALUES)})")  # fmt: skip
# the connections whose session holds that statement (prepared once per connection; a
# connection that is replaced takes its own with it, and a rollback may too: forget_prepared)
_events_prepared: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()
# the catalogue's statements each connection's session has prepared for batches, by name
_session_prepared: weakref.WeakKeyDictionary[psycopg.Connection[Any], set[str]] = (
    weakref.WeakKeyDictionary()
)
_PARAM = re.compile(r"%\((\w+)\)s")


def forget_prepared(conn: psycopg.Connection[Any]) -> None:
    """The session may have let go of the statements it prepared: the driver deallocates
    every prepared statement of a connection after a ROLLBACK (and a DROP or an ALTER) it
    sends (psycopg: "DEALLOCATE ALL" before the next statement), and a connection pooler may
    too. The next use prepares them again."""
    _events_prepared.discard(conn)
    _session_prepared.pop(conn, None)


@record
class Prepared:
    """A catalogue statement as the session prepares it (``PREPARE``: its parameters numbered
    in the order they first appear, their types inferred by the server) and the ``EXECUTE``
    that runs it, its values for the driver to quote (``mogrify``)."""

    name: str  # the session's name for it
    prepare: str
    execute: str

    @staticmethod
    @cache
    def of(name: str, statement: str) -> Prepared:
        order: list[str] = []

        def number(found: re.Match[str]) -> str:
            if found[1] not in order:
                order.append(found[1])
            return f"${order.index(found[1]) + 1}"

        body = _PARAM.sub(number, statement).replace("%%", "%")  # no values: a % is a %
        # the text's checksum in the name: a statement whose text changes is another one
        session = f"leasekeeper_{name.lower()}_{zlib.crc32(statement.encode()):08x}"
        values = f"({', '.join(f'%({n})s' for n in order)})" if order else ""
        return Prepared(session, f"PREPARE {session} AS {body}", f"EXECUTE {session}{values}")


Call = tuple[str, str, Params]  # a statement's name, its text, its values


class Batch:
    """Statements sent in one round trip: one query of ``EXECUTE``s (the simple query
    protocol; values quoted by the driver), each of a statement the session prepared at its
    first use, so the server plans it once per connection. It costs one round trip and a
    fraction of the client's CPU of a driver pipeline (five small statements on a 2-core VM:
    161 us of CPU and 340 us wall, against 785-995 us and 1.3-1.5 ms pipelined, and 480 us
    and 1.1 ms one at a time), and the server runs the statements in order, each after the
    locks of the one before; the first that fails raises and skips the rest (the transaction
    is then rolled back, like any failure)."""

    def __init__(self, conn: psycopg.Connection[Any], pooled: bool = False) -> None:
        self.conn = conn
        self.pooled = pooled  # behind a transaction pooler: no statement the session keeps

    def texts(self, calls: Sequence[Call], query: psycopg.ClientCursor[Any]) -> list[str]:
        """The ``EXECUTE`` of each call, its values quoted; what the session has not
        prepared yet is prepared first (its own round trip, once per connection). Behind a
        transaction pooler, each statement itself, its values quoted: the next transaction
        may run on another server session, which never saw a ``PREPARE`` of this one."""
        if self.pooled:
            return [query.mogrify(sql, params) for _, sql, params in calls]
        known = _session_prepared.setdefault(self.conn, set())
        forms = [Prepared.of(name, sql) for name, sql, _ in calls]
        new = {form.name: form.prepare for form in forms if form.name not in known}
        if new:
            query.execute(";\n".join(new.values()))
            known.update(new)
        return [query.mogrify(form.execute, params)
                for form, (_, _, params) in zip(forms, calls, strict=True)]  # fmt: skip

    def run(self, calls: Sequence[Call], begin: str | None = None) -> list[tuple[list[Row], int]]:
        """Each call's rows (none for a statement that returns none) and the rows it
        changed, in order. The statements run on their generic plans (``_GENERIC``).
        ``begin``: the transaction's BEGIN (one statement), not sent yet: it goes first in
        the same query."""
        if not calls:
            return []
        with psycopg.ClientCursor(self.conn) as query:
            texts = self.texts(calls, query)  # (a PREPARE is the session's: no transaction)
            query.execute(";\n".join([*([begin] if begin else []), _GENERIC, *texts, _AUTO]))
            if begin:
                query.nextset()  # the first result is the BEGIN's
            out: list[tuple[list[Row], int]] = []
            while query.nextset():  # the next is the SET's
                rows = query.fetchall() if query.description is not None else []
                out.append((rows, len(rows) if query.description is not None else query.rowcount))
        out.pop()  # the last SET's
        if len(out) != len(calls):  # a statement of ours that is several: a bug, not data
            raise RuntimeError(f"a batch of {len(calls)} statements answered {len(out)}")
        return out


# A prepared statement is planned for its values (a custom plan) at its first five runs, and
# then on a generic plan unless that plan's estimate is dearer than theirs: one that takes an
# array of gates (GATE_STATE) is estimated for ten where it gets one, so the server planned it
# again at every claim. Our statements are index walks whatever their values, so a batch runs
# them on their generic plans (SET LOCAL: to the end of the batch, or of the transaction if it
# fails first).
_GENERIC = "SET LOCAL plan_cache_mode = force_generic_plan"
_AUTO = "SET LOCAL plan_cache_mode = auto"


def _steps_first(tx: PostgresTx) -> list[tuple[str, list[Params]]]:
    """The writes waiting for the gates that can go in one round trip: a step (Python between
    statements) cannot, so what comes up to the last step is sent first, in order."""
    ahead, tx.ahead = tx.ahead, []
    steps = [i for i, (name, _) in enumerate(ahead) if not isinstance(CATALOGUE[name], str)]
    cut = steps[-1] + 1 if steps else 0
    for name, each in ahead[:cut]:
        tx.many(name, each)
    return ahead[cut:]


def begin_locked(conn: psycopg.Connection[Any], begin: str, run_ids: Sequence[int]) -> None:
    """``begin`` (the transaction's BEGIN) and ``LOCK_RUNS`` of ``run_ids`` in one query (the
    lock an ``EXECUTE`` of the statement the session prepared, ``Batch``): a batch's
    transaction starts with one round trip, not two."""
    with psycopg.ClientCursor(conn) as query:
        (text,) = Batch(conn).texts([("LOCK_RUNS", LOCK_RUNS, {"run_ids": list(run_ids)})], query)
        query.execute(f"{begin};\n{text}")


def commit(conn: psycopg.Connection[Any], cur: Cursor, tx: PostgresTx) -> None:
    """COMMIT, with what waits for it written in the same round trip, just before it: the
    gate writes held back (``Tx.settle_gates`` and its kind: a commit's settling when no
    claim looked at its gates), a claim's ``Tx.write_gates`` and the transaction's events
    (B18), in one query of several statements (``EXECUTE``s of statements the session
    prepared, ``Batch``; the events by ``EXECUTE`` of the session's prepared
    ``INSERT_EVENTS``; ``COMMIT``), so none costs a round trip of its own and the server
    plans each once per connection. A failed statement skips the COMMIT: the transaction is
    rolled back (``_rollback``). A BEGIN not sent yet (``PostgresTx.begin``) goes first in
    the same query; with nothing to write either, nothing is sent (no transaction began)."""
    if not tx.events and not tx.deferred and not tx.ahead:
        if tx.begin is None:
            cur.execute("COMMIT")
        tx.begin = None
        return
    deferred = _steps_first(tx) + tx.deferred
    events, tx.events, tx.deferred = tx.events, [], []
    if events and not tx.pooled and conn not in _events_prepared:  # once per connection
        cur.execute(_PREPARE_EVENTS)
        _events_prepared.add(conn)
    with psycopg.ClientCursor(conn) as query:
        calls = [
            (name, _sql(CATALOGUE, name), params) for name, each in deferred for params in each
        ]
        if events and tx.pooled:  # behind a pooler: the statement itself, not the session's
            calls.append(_events_call(events, tx.now))
            events = []
        parts = Batch(conn, tx.pooled).texts(calls, query)
        if events:
            entry = CATALOGUE["INSERT_EVENTS"]
            assert isinstance(entry, Shaped)
            shaped = entry.shape({"events": events, "now": tx.now})
            parts.append(query.mogrify(_EXECUTE_EVENTS, shaped))
        begin, tx.begin = tx.begin, None  # (the steps above sent it if they ran)
        query.execute(";\n".join([*([begin] if begin else []), *parts, "COMMIT"]))


class PostgresTx(Tx):
    """A transaction on one cursor. ``prefix``: how our tables are named on a caller's own
    connection (transactional enqueue), whose search path is not our schema."""

    catalogue: ClassVar[Catalogue] = CATALOGUE

    def __init__(
        self, cur: Cursor, now: float | None, prefix: str = "", schema: str = "",
        *, pooled: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(now)
        self._cur = cur
        self.prefix = prefix
        self.schema = schema  # with a prefix: the schema it names
        self.pooled = pooled  # behind a transaction pooler: nothing prepared
        # never on a caller's connection (its own rule), never behind a pooler
        self.prepare: bool | None = None if prefix else not pooled
        # the transaction's BEGIN while it is not sent yet: it goes in the query of the first
        # batch of statements (``Batch``) or the COMMIT's, else on its own before the first
        # statement sent alone (``begun``), so a transaction that begins with a batch costs
        # no round trip for its BEGIN
        self.begin: str | None = None

    @property
    def cur(self) -> Cursor:
        """The transaction's cursor, its BEGIN sent (on its own if it was not yet): whatever
        runs on it runs inside the transaction."""
        if self.begin is not None:
            begin, self.begin = self.begin, None
            self._cur.execute(begin)
        return self._cur

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The transaction's connection, sending nothing (a key for what a session keeps)."""
        return self._cur.connection

    def execute(self, sql: str, params: Params) -> Cursor:
        return self.cur.execute(sql, params, prepare=self.prepare)

    def time(self) -> float:
        if self.now is not None:
            return self.now
        row = self.execute(NOW, {"now": None}).fetchone()
        assert row is not None
        return float(row[0])

    def many(self, name: str, each: Sequence[Params]) -> list[int]:
        """One statement for every parameter set, sent together and read back in one round
        trip (``Batch``); each answers the rows it changed."""
        statement = self.catalogue[name]
        if not isinstance(statement, str) or self.prefix or len(each) < 2:
            return super().many(name, each)
        calls = [(name, statement, params) for params in each]
        return [changed for _, changed in self._run(calls)]

    def _gates_then(
        self, name: str, params: Params, after: Calls = (), first: Calls = ()
    ) -> GatesRead:
        """``first``, the events emitted so far (they wait for no lock: written here, they
        are not written while the gates are held), the writes waiting for the gates, the
        statement, the clock and ``after``, in one round trip (``Batch``: the server runs
        them in order, each after the locks of the one before)."""
        names = [name, *(n for n, _ in after), *(n for n, _ in first)]
        if self.prefix or any(not isinstance(self.catalogue[n], str) for n in names):
            return super()._gates_then(name, params, after, first)
        calls = [(n, self._sql(n), p) for n, p in first]
        if self.events:
            calls.append(_events_call(self.events, self.now))
            self.events = []
        calls += [(n, self._sql(n), p) for n, each in _steps_first(self) for p in each]
        at = len(calls)
        calls.append((name, self._sql(name), params))
        if self.now is None:
            calls.append(("NOW", NOW, {"now": None}))
        calls += [(n, self._sql(n), p) for n, p in after]
        results = self._batch(calls)
        now = self.now if self.now is not None else float(results[at + 1][0][0])
        return GatesRead(results[at], now, results[len(calls) - len(after) :],
                         results[: len(first)])  # fmt: skip

    def open_gates(
        self, queues: Sequence[str] | None, want: int, limit: int,
        tasks: Sequence[str] | None = None,
    ) -> Opened:  # fmt: skip
        """A transaction that settled no gate: the claim's first look (the states of the
        first ``want`` open gates and their lines' first runs, as ``Admission.first_look``
        asks them) goes in ``OPEN_GATES``' round trip, read by statements after its locks
        (``OPEN_MARKED``); the others as every engine does (``InTurn.open_gates``)."""
        settling = any(name == "GATE_SETTLE" for name, _ in self.ahead)
        steps = any(not isinstance(self.catalogue[n], str) for n, _ in self.ahead)
        if settling or steps or want < 1 or self.prefix:
            return super().open_gates(queues, want, limit, tasks)
        calls: list[Call] = []
        if self.events:  # (as ``_gates_then``: they wait for no lock)
            calls.append(_events_call(self.events, self.now))
            self.events = []
        ahead, self.ahead = self.ahead, []
        calls += [(n, self._sql(n), p) for n, each in ahead for p in each]
        at = len(calls)
        calls.append(("OPEN_MARKED", g.OPEN_MARKED, {"now": self.now, "limit": limit}))
        if self.now is None:
            calls.append(("NOW", NOW, {"now": None}))
        look = {"want": want, "now": self.now, "queues": None if queues is None else list(queues),
                "tasks": None if tasks is None else list(tasks)}  # fmt: skip
        calls += [("OPEN_STATES", g.OPEN_STATES, look), ("OPEN_LINES", g.OPEN_LINES, look)]
        results = self._batch(calls)
        gates: list[str] = list(results[at][0][0] or [])
        now = self.now if self.now is not None else float(results[at + 1][0][0])
        if not gates:
            return Opened([], now)
        held = gates[:want]
        return Opened(gates, now, held, results[-2], by_line(held, results[-1]),
                      1 if len(gates) > 1 else want)  # fmt: skip

    def _each(self, calls: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        """The statements in one round trip (``Batch``; one alone as itself), their rows in
        order."""
        steps = any(not isinstance(self.catalogue[n], str) for n, _ in calls)
        if len(calls) == 1 or self.prefix or steps:
            return super()._each(calls)
        return self._batch([(name, self._sql(name), params) for name, params in calls])

    def _sql(self, name: str) -> str:
        return _sql(self.catalogue, name)

    def _batch(self, calls: Sequence[Call]) -> list[list[Row]]:
        return [rows for rows, _ in self._run(calls)]

    def _run(self, calls: Sequence[Call]) -> list[tuple[list[Row], int]]:
        """``calls`` in one round trip (``Batch``), the BEGIN first if it was not sent."""
        begin, self.begin = (self.begin, None) if calls else (None, self.begin)
        return Batch(self._cur.connection, self.pooled).run(calls, begin)


def _events_call(events: list[Params], now: float | None) -> Call:
    """The events emitted so far as one statement of a batch (``INSERT_EVENTS``)."""
    entry = CATALOGUE["INSERT_EVENTS"]
    assert isinstance(entry, Shaped)
    return "INSERT_EVENTS", entry.statement(""), entry.shape({"events": events, "now": now})


def _sql(catalogue: Catalogue, name: str) -> str:
    statement = catalogue[name]
    assert isinstance(statement, str)
    return statement
