"""The driver's verbs (``driver.Driver``) written once over a transaction's named
statements, each in turn (``InTurn``, which every ``dialect.Tx`` is): what SQLite runs as it
is, and what PostgreSQL's transaction (``postgres/tx.py``) gives its round trips by
overriding how the verbs' statements go (``_gates_then``, ``_each``, ``many``) and writing
what is held back with its COMMIT.

The gate writes are held back in order: those that wait for a gate's lock in ``ahead``, until
the transaction next looks at its gates (``open_gates``) or commits; a claim's write-back in
``deferred``, until the COMMIT (a placement sends it first: it writes the same rows). The
dialect's ``Tx.flush`` writes what is held back before COMMIT.

The verbs a program may ask for (``asks.py``: ``start_runs``, ``signal``, ``read_events``)
are written once as programs (``starts.py``); ``InTurn`` drives them over its statements
(``run_program``) and the async store's transaction on PostgreSQL runs them inline
(``starts.in_statements``)."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from .asks import (
    Answer,
    Ask,
    EventRow,
    EventsAsk,
    Program,
    SignalAsk,
    SignalRow,
    Started,
    StartRuns,
)
from .driver import (
    REFUSED,
    Ack,
    Advance,
    CancelRow,
    ClaimAsk,
    Completed,
    Completion,
    Driver,
    Finish,
    GateLook,
    GateSettle,
    Handback,
    Keep,
    KeepRow,
    LeaseRuns,
    Opened,
    Placing,
    Release,
    RenewAsk,
    RenewRow,
    SetState,
    by_line,
)  # fmt: skip
from .limits import gate_writes
from .starts import place, signalling, starting

if TYPE_CHECKING:
    from .dialect import ClaimRow, Params, Row
    from .limits import GateState


# each completion's statement (a batch of N >= 1 of its records, ``commits``; a row per commit
# written: its run's id, and for an ack whether it ended the run)
COMPLETIONS: dict[type[Completion], str] = {
    Finish: "FINISH", Advance: "ADVANCE", Release: "RELEASE", Handback: "HANDBACK", Ack: "ACK",
    SetState: "SET_STATE",
}  # fmt: skip
WRITTEN, ENDED = Completed(True), Completed(True, True)
Calls = Sequence[tuple[str, "Params"]]  # named statements, each with its parameters


class GatesRead(NamedTuple):
    """What ``InTurn._gates_then`` read: the statement's rows, the clock after its locks, and
    the rows of each statement asked after it and before it."""

    rows: list[Row]
    now: float
    after: list[list[Row]]
    first: list[list[Row]]


class InTurn(Driver):
    """The driver's verbs over ``rows`` and ``many`` (a ``dialect.Tx``'s)."""

    now: float | None
    events: list[Params]  # what the transaction's transitions emitted (``dialect.Tx``)
    ahead: list[tuple[str, list[Params]]]  # gate writes waiting for the gates' next look
    deferred: list[tuple[str, list[Params]]]  # gate writes and totals waiting for the COMMIT

    @abc.abstractmethod
    def rows(self, name: str, params: Params) -> list[Row]: ...

    @abc.abstractmethod
    def many(self, name: str, each: Sequence[Params]) -> list[int]: ...

    @abc.abstractmethod
    def time(self) -> float: ...

    @abc.abstractmethod
    def one(self, name: str, params: Params) -> Row | None: ...

    @abc.abstractmethod
    def count(self, name: str, params: Params) -> int: ...

    def claim_rows(self, ask: ClaimAsk) -> list[ClaimRow]:
        name = "CLAIM_QUEUES" if ask.queues is not None else "CLAIM_OTHERS" if ask.skip else "CLAIM"
        params = {"owner": ask.owner, "ttl": float(ask.ttl), "now": self.now, "limit": ask.limit,
                  "queues": None if ask.queues is None else list(ask.queues),
                  "start": ask.start, "skip": list(ask.skip),
                  "tasks": None if ask.tasks is None else list(ask.tasks)}  # fmt: skip
        if ask.task is not None:  # a batch's claim: one task's runs (``CLAIM_TASK``)
            name, params["task"] = "CLAIM_TASK", ask.task
        return cast("list[ClaimRow]", self.rows(name, params))  # as every catalogue builds them

    def lease_runs(self, ask: LeaseRuns) -> list[ClaimRow]:
        params = {"run_ids": list(ask.run_ids), "owner": ask.owner, "ttl": float(ask.ttl),
                  "now": self.now, "start": ask.start}  # fmt: skip
        return cast("list[ClaimRow]", self.rows("CLAIM_RUNS", params))

    def complete(self, batch: Sequence[Completion]) -> list[Completed]:
        kinds: dict[type[Completion], list[int]] = {}
        for i, commit in enumerate(batch):
            kinds.setdefault(type(commit), []).append(i)
        out = [REFUSED] * len(batch)
        for kind, members in kinds.items():
            rows = self.rows(COMPLETIONS[kind], {"commits": [batch[i] for i in members],
                                                 "now": self.now})  # fmt: skip
            if kind is Ack:
                written = {row[0]: ENDED if row[1] else WRITTEN for row in rows}
            else:
                written = dict.fromkeys((row[0] for row in rows),
                                        ENDED if kind is Finish else WRITTEN)  # fmt: skip
            for i in members:
                out[i] = written.get(batch[i].run_id, REFUSED)
        return out

    def cancel_run(self, run_id: int) -> CancelRow | None:
        found = self.one("RUN_STATUS", {"run_id": run_id})
        if found is None:
            return None
        params = {"run_id": run_id, "now": self.now}
        status, queue = str(found[0]), str(found[1])
        if status == "pending":  # a run that waits in its line may close it (B12)
            self.count("REOPEN_RUN", params)
        if self.count("CANCEL_RUN", params) != 1:
            return CancelRow(status, queue, False, [])
        gone = self.rows("CANCEL_DESCENDANTS", params)
        return CancelRow(status, queue, True, [(str(row[0]), int(row[1])) for row in gone])

    def keep_call(self, keep: Keep) -> KeepRow:
        if keep.intent is not None and self.one(
            "ANSWER_INTENT", {"intent": keep.intent, "now": self.now}
        ) is None:  # fmt: skip
            return KeepRow("answered")
        params = {"run_id": keep.run_id, "task_id": keep.task_id, "name": keep.name,
                  "request_hash": keep.request_hash, "result": keep.result,
                  "attempt": keep.attempt, "owner": keep.owner, "tokens": keep.tokens}  # fmt: skip
        if self.count("KEEP_CALL", {**params, "now": self.now}) == 1:
            return KeepRow("kept", keep.result, keep.attempt, keep.tokens)
        row = self.one("CALL_LOSER", params)
        if row is None:
            return KeepRow("none")
        return KeepRow("lost_race", row[0], int(row[1]), None if row[2] is None else int(row[2]))

    def start_runs(self, ask: StartRuns) -> list[Started]:
        return self.run_program(starting(ask, self.now))

    def signal(self, ask: SignalAsk) -> SignalRow:
        return self.run_program(signalling(ask, self.now))

    def read_events(self, ask: EventsAsk) -> list[EventRow]:
        return [EventRow._make(row[:7]) for row in self.rows(*ask.statement())]

    def run_program(self, program: Program[Answer]) -> Answer:
        """Run ``program`` here: each statement it yields, its rows sent back; each ask, its
        verb's answer. Its events (``INSERT_EVENTS``) wait with those of the transaction's
        other transitions, for ``Tx.flush``."""
        try:
            step = next(program)
            while True:
                answer: Any
                if isinstance(step, Ask):
                    answer = getattr(self, step.verb)(step)
                elif step[0] == "INSERT_EVENTS":
                    self.events.extend(step[1]["events"])
                    answer = []
                else:
                    answer = self.rows(*step)
                step = program.send(answer)
        except StopIteration as done:
            return cast("Answer", done.value)

    def renew_leases(self, ask: RenewAsk) -> list[RenewRow]:
        params = {"leases": list(ask.leases), "owner": ask.owner, "ttl": float(ask.ttl),
                  "starting": list(ask.starting), "now": self.now}  # fmt: skip
        return [RenewRow(int(r[0]), int(r[1]), float(r[2]), bool(r[3]))
                for r in self.rows("RENEW_MANY", params)]  # fmt: skip

    def settle_gates(self, settles: Sequence[GateSettle]) -> None:
        self._gate_write("GATE_SETTLE", [{"gate": s.gate, "back": s.back, "charged": s.charged,
                                          "unstart": s.unstart, "pause": s.pause,
                                          "now": self.now} for s in settles])  # fmt: skip

    def place_gates(self, placing: Placing) -> None:
        if self.deferred:  # a claim's write-back first: PLACE_GATES writes those gates too
            self._write_deferred()
        name, params = place(placing, self.now)
        self._gate_write(name, [params])

    def reopen_runs(self, run_ids: Sequence[int]) -> None:
        self._gate_write("REOPEN_RUN", [{"run_id": r, "now": self.now} for r in run_ids])

    def open_gates(
        self, queues: Sequence[str] | None, want: int, limit: int,
        tasks: Sequence[str] | None = None,
    ) -> Opened:  # fmt: skip
        """The settled gates' first runs are read before the gate writes held back (only what
        the gate decides waits for its lock, and those runs are only ever leased by a claimer
        that holds their gate), ``OPEN_GATES`` and the clock after them, the settled gates'
        states last (a settle locks its gate: they see it)."""
        held = sorted({p["gate"] for name, each in self.ahead if name == "GATE_SETTLE"
                       for p in each}) if want > 0 else []  # fmt: skip
        lines = {"lines": held, "queues": None if queues is None else list(queues),
                 "tasks": None if tasks is None else list(tasks), "limit": want,
                 "now": self.now}  # fmt: skip
        after = [("GATE_STATE", {"gates": held, "now": self.now})] if held else []
        first = [("LINE_RUNS", lines)] if held else []
        rows, now, more, before = self._gates_then(
            "OPEN_GATES", {"now": self.now, "limit": limit}, after, first
        )
        if not held:
            return Opened([row[0] for row in rows], now)
        return Opened([row[0] for row in rows], now, held, more[0], by_line(held, before[0]),
                      want)  # fmt: skip

    def look_gates(
        self, gates: Sequence[str], lines: Sequence[str] = (),
        queues: Sequence[str] | None = None, limit: int = 0,
        tasks: Sequence[str] | None = None,
    ) -> GateLook:  # fmt: skip
        calls: list[tuple[str, Params]] = []
        if gates:
            calls.append(("GATE_STATE", {"gates": list(gates), "now": self.now}))
        if lines:
            ask = {"lines": list(lines), "queues": None if queues is None else list(queues),
                   "tasks": None if tasks is None else list(tasks), "limit": limit,
                   "now": self.now}  # fmt: skip
            calls.append(("LINE_RUNS", ask))
        got = self._each(calls) if calls else []
        states = got.pop(0) if gates else []
        return GateLook(states, by_line(lines, got.pop(0)) if lines else {})

    def write_gates(self, states: Sequence[GateState], now: float) -> None:
        if states:
            self.deferred.append(("GATE_WRITE", [gate_writes(states, now)]))

    # -- how the gates' verbs go: each driver decides (PostgreSQL overrides these) -----------
    def _gate_write(self, name: str, each: list[Params]) -> None:
        """``many(name, each)``, held back until just before this transaction next looks at
        its gates (``_gates_then``), or else before COMMIT: a write that waits for the gates'
        locks holds them from there to the COMMIT only."""
        if each:
            self.ahead.append((name, each))

    def _gates_then(
        self, name: str, params: Params, after: Calls = (), first: Calls = ()
    ) -> GatesRead:
        """The rows of each of ``first``, then the writes waiting for the gates, then
        ``rows(name, params)``, then ``time()`` (read after that statement's locks), then the
        rows of each of ``after``."""
        before = [self.rows(n, p) for n, p in first]
        self._write_ahead()
        rows = self.rows(name, params)
        now = self.time()
        return GatesRead(rows, now, [self.rows(n, p) for n, p in after], before)

    def _each(self, calls: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        """``rows(name, params)`` for each call, in order."""
        return [self.rows(name, params) for name, params in calls]

    def _write_ahead(self) -> None:
        """Send the writes waiting for the gates now, in order."""
        ahead, self.ahead = self.ahead, []
        for name, each in ahead:
            self.many(name, each)

    def _write_deferred(self) -> None:
        """Send what waits for the COMMIT now (the writes waiting for the gates first)."""
        self._write_ahead()
        deferred, self.deferred = self.deferred, []
        for name, each in deferred:
            self.many(name, each)
