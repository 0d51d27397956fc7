"""A PostgreSQL transaction under the protocol (``PostgresTx``) and its COMMIT: statements
prepared once per session, ``many`` and the writes waiting for the gates pipelined, and what
waits for the COMMIT sent in the COMMIT's own round trip."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, ClassVar

import psycopg

from ..dialect import Catalogue, Params, Row, Shaped, Tx
from .ops_sql import NOW
from .steps import CATALOGUE, many

Cursor = psycopg.Cursor[Any]


def _insert_events_prepared() -> str:
    """``INSERT_EVENTS`` as a prepared statement of the session (its two values as $1, $2)."""
    entry = CATALOGUE["INSERT_EVENTS"]
    assert isinstance(entry, Shaped)
    text = entry.statement("").replace("%(events)s", "$1").replace("%(now)s", "$2")
    return f"PREPARE {_EVENTS_STATEMENT} (text, float8) AS {text}"


_EVENTS_STATEMENT = "leasekeeper_insert_events"
_PREPARE_EVENTS = _insert_events_prepared()
# the connections whose session holds that statement (prepared once per connection: a prepared
# statement outlives a rollback, and a connection that is replaced takes its own with it)
_events_prepared: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()


def _steps_first(tx: PostgresTx) -> list[tuple[str, list[Params]]]:
    """The writes waiting for the gates that can go in one round trip: a step (Python between
    statements) cannot, so what comes up to the last step is sent first, in order."""
    ahead, tx.ahead = tx.ahead, []
    steps = [i for i, (name, _) in enumerate(ahead) if not isinstance(CATALOGUE[name], str)]
    cut = steps[-1] + 1 if steps else 0
    for name, each in ahead[:cut]:
        tx.many(name, each)
    return ahead[cut:]


def commit(conn: psycopg.Connection[Any], cur: Cursor, tx: PostgresTx) -> None:
    """COMMIT, with what waits for it written in the same round trip, just before it: the
    writes waiting for the gates (``before_gates``: a commit's settling when no claim looked
    at its gates), those of ``at_commit`` and the transaction's events (B18), in one query of
    several statements (the events by ``EXECUTE`` of the session's prepared ``INSERT_EVENTS``;
    ``COMMIT``; the simple query protocol, its values bound by the driver), so none costs a
    round trip of its own and the server plans the events' insert once per connection. A
    failed statement skips the COMMIT: the transaction is rolled back (``_rollback``)."""
    if not tx.events and not tx.deferred and not tx.ahead:
        cur.execute("COMMIT")
        return
    deferred = _steps_first(tx) + tx.deferred
    events, tx.events, tx.deferred = tx.events, [], []
    if events and conn not in _events_prepared:  # once per connection, in this transaction
        cur.execute(_PREPARE_EVENTS)
        _events_prepared.add(conn)
    with psycopg.ClientCursor(conn) as query:
        parts = []
        for name, each in deferred:
            statement = CATALOGUE[name]
            assert isinstance(statement, str)
            parts += [query.mogrify(statement, params) for params in each]
        if events:
            entry = CATALOGUE["INSERT_EVENTS"]
            assert isinstance(entry, Shaped)
            shaped = entry.shape({"events": events, "now": tx.now})
            parts.append(query.mogrify(f"EXECUTE {_EVENTS_STATEMENT} (%(events)s, %(now)s)",
                                       shaped))  # fmt: skip
        query.execute(";\n".join([*parts, "COMMIT"]))


class PostgresTx(Tx):
    """A transaction on one cursor. ``prefix``: how our tables are named on a caller's own
    connection (transactional enqueue), whose search path is not our schema."""

    catalogue: ClassVar[Catalogue] = CATALOGUE
    pipelined: ClassVar[bool] = True

    def __init__(self, cur: Cursor, now: float | None, prefix: str = "", schema: str = "") -> None:
        super().__init__(now)
        self.cur = cur
        self.prefix = prefix
        self.schema = schema  # with a prefix: the schema it names
        self.prepare: bool | None = None if prefix else True  # never on a caller's connection

    def execute(self, sql: str, params: Params) -> Cursor:
        return self.cur.execute(sql, params, prepare=self.prepare)

    def time(self) -> float:
        if self.now is not None:
            return self.now
        row = self.execute(NOW, {"now": None}).fetchone()
        assert row is not None
        return float(row[0])

    def many(self, name: str, each: Sequence[Params]) -> list[int]:
        """One statement for every parameter set, pipelined: sent together, read back in one
        round trip (``executemany``); each answers the rows it changed."""
        statement = self.catalogue[name]
        if not isinstance(statement, str):
            return super().many(name, each)
        batched = many(self, name, each)  # one statement for the batch, where there is one
        if batched is not None:
            return batched
        self.cur.executemany(statement, each, returning=True)
        counts = []
        for n in range(len(each)):
            if n:
                self.cur.nextset()
            counts.append(len(self.cur.fetchall()))
        return counts

    def ahead_then(
        self, name: str, params: Params, after: Sequence[tuple[str, Params]] = ()
    ) -> tuple[list[Row], float, list[list[Row]]]:
        """The writes waiting for the gates, the statement, the clock and ``after``, in one
        round trip (a pipeline: the server runs them in order, each after the locks of the one
        before)."""
        names = [name, *(n for n, _ in after)]
        if self.prefix or any(not isinstance(self.catalogue[n], str) for n in names):
            return super().ahead_then(name, params, after)
        calls = [(self._sql(n), p) for n, each in _steps_first(self) for p in each]
        first = len(calls)
        calls.append((self._sql(name), params))
        if self.now is None:
            calls.append((NOW, {"now": None}))
        calls += [(self._sql(n), p) for n, p in after]
        results = self._pipeline(calls)
        now = self.now if self.now is not None else float(results[first + 1][0][0])
        return results[first], now, results[len(calls) - len(after) :]

    def _each(self, calls: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        """The statements in one round trip (a pipeline), their rows in order."""
        if self.prefix or any(not isinstance(self.catalogue[n], str) for n, _ in calls):
            return super()._each(calls)
        return self._pipeline([(self._sql(name), params) for name, params in calls])

    def _sql(self, name: str) -> str:
        statement = self.catalogue[name]
        assert isinstance(statement, str)
        return statement

    def _pipeline(self, calls: list[tuple[str, Params]]) -> list[list[Row]]:
        """Each statement on a cursor of its own, sent together; the rows of each (an error
        raises when the pipeline ends: the transaction is rolled back like any failure)."""
        conn = self.cur.connection
        cursors = [conn.cursor() for _ in calls]
        try:
            with conn.pipeline():
                for cur, (sql, values) in zip(cursors, calls, strict=True):
                    cur.execute(sql, values, prepare=self.prepare)
            return [cur.fetchall() if cur.description is not None else [] for cur in cursors]
        finally:
            for cur in cursors:
                cur.close()
