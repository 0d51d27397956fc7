"""The typed asks and rows of the driver's verbs that a *program* may ask for (``driver.py``
re-exports them; kept apart only to keep each file short): a start of runs (``StartRuns``,
answered ``Started`` each), a signal (``SignalAsk``, answered ``SignalRow``) and a read of
the outbox (``EventsAsk``, answered ``EventRow`` each).

A program (``protocol/programs.py``: a generator that yields what it needs next and is sent
the answer) yields a statement ``(name, params)`` or one of these asks (an ``Ask``): a
``dialect.Tx`` answers an ask with its verb of the ask's name (``InTurn.run_program``), a
transaction that is not one (the async store's on PostgreSQL) with the verb's shared program
(``verbs.in_statements``). The parameters of the statements are built here, from the asks'
fields (``params``), never by the protocol."""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar

from .records import record

if TYPE_CHECKING:
    from .newrun import NewRun

Answer = TypeVar("Answer")
Statement = tuple[str, dict[str, Any]]  # a catalogue name and its parameters


class Ask:
    """An ask a program may yield instead of a statement: answered by the driver's verb
    ``verb`` (a method of ``driver.Driver`` that takes the ask)."""

    verb: ClassVar[str]


# a transaction's body: statements and asks, one at a time, each sent its answer
Program = Generator["Statement | Ask", Any, Answer]
Statements = Generator[Statement, Any, Answer]  # a program that asks for no verb


@record
class StartRuns(Ask):
    """Start ``runs`` (checked and encoded: ``NewRun``), each with its first task, its
    ``run.enqueued`` event, its key (a key taken answers that run) and its debounce (B7)."""

    verb: ClassVar[str] = "start_runs"
    runs: tuple[NewRun, ...]


class Started(NamedTuple):
    """One run of a start: its id, and whether this start made it (False: its key named a
    run already there, or a debounced start gave that run its payload)."""

    run_id: int
    made: bool


@record
class SignalAsk(Ask):
    """Signal ``name`` (``payload``: JSON text) to run ``run_id`` (B14)."""

    verb: ClassVar[str] = "signal"
    run_id: int
    name: str
    payload: str

    def params(self, now: float | None) -> dict[str, Any]:
        """``INSERT_SIGNAL``'s parameters."""
        return {"run_id": self.run_id, "name": self.name, "payload": self.payload, "now": now}


class SignalRow(NamedTuple):
    """What a signal did: kept (``signal_id``; ``resumed``: delivered at once to the wait
    it ended), or nothing kept (``signal_id`` None): the run is over (``status``: what it
    is now) or there is no such run (``status`` None)."""

    signal_id: int | None
    resumed: bool = False
    status: str | None = None


@record
class EventsAsk(Ask):
    """Up to ``limit`` events with ids above ``after`` in commit order (B18): of run ``run``
    only, or else of the runs numbered below ``below`` (the users' runs, or the system's
    too: B20)."""

    verb: ClassVar[str] = "read_events"
    after: int
    limit: int
    run: int | None = None
    below: int | None = None

    def statement(self) -> Statement:
        """The named statement that reads them (the async store sends it outside a
        transaction)."""
        params: dict[str, Any] = {"after": self.after, "limit": self.limit}
        if self.run is None:
            return "LIST_EVENTS", {**params, "below": self.below}
        return "LIST_RUN_EVENTS", {**params, "run_id": self.run}


class EventRow(NamedTuple):
    """One event as written: its id, time, run, kind, task and attempt, and its data (JSON
    text)."""

    id: int
    at: float
    run_id: int | None
    kind: str
    task: str | None
    attempt: int | None
    data: str | None
