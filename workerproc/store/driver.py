"""The driver's verbs: what the protocol asks of a write transaction beyond a named
statement, as typed operations (parameters and rows are the classes below, never dicts) whose
contracts say what each one does and is ordered before and after, never how it travels:

- the claim: ``claim_rows`` (the plain walk, R1), ``lease_runs`` (the runs a gated claim
  admitted), both answering ``dialect.ClaimRow``; the renewal: ``renew_leases`` (R3, B5);
- the completions (R2, R5, B3, B4): ``complete``, N >= 1 fenced writes that each end or move a
  lease (``Finish``, ``Advance``, ``Release``, ``Handback``; ``Ack`` and ``SetState``, the
  pinned single-lease calls, are the same verb's), each judged on its own (``Completed``);
- operators (B2, B14, B15): ``cancel_run``, a live run cancelled with its live descendants;
- paid calls (B13): ``keep_call``, a paid answer kept (its intent answered, the first answer
  winning);
- flow control's gates (B12): ``settle_gates``, ``place_gates``, ``reopen_runs``,
  ``open_gates``, ``look_gates``, ``write_gates``;
- producers (B7): ``start_runs``, runs started with their first tasks, events, keys and
  debounce; waits (B14): ``signal``, a signal kept and delivered; the outbox (B18):
  ``read_events``, events after a cursor (``Tx.events`` is what a transaction emits). These
  three take asks a program may yield too (``asks.py``: the async store runs the same
  programs, ``verbs.in_statements``).

The protocol (``store/protocol/gates.py``, the commits, the claim) decides what a gate write
or read is; a driver decides how the statements go. Three orderings matter to the gates, and
each is part of a verb's contract instead of a round trip the protocol schedules:

- **A write that waits for a gate's lock** (``settle_gates``, ``place_gates``,
  ``reopen_runs``): it takes the gate's lock, and holds it from then to the COMMIT, so it is
  written as late as can be, yet before anything in the transaction reads gates
  (``open_gates``) and before the COMMIT. Such writes keep the order they were made in.
- **A write nothing later in the transaction reads** (``write_gates``: the gates a claim
  changed): written before the COMMIT, after every gate write made before it; a later
  ``place_gates`` comes after it (it writes the same rows).
- **Reads that may go together** (``open_gates`` with the states and first runs of the gates
  this transaction settled, ``look_gates``): one verb each, answered together.

``verbs.InTurn`` implements the verbs once, over a transaction's statements in turn (every
``dialect.Tx`` is one; on SQLite each statement is a call in process);
``postgres.tx.PostgresTx`` sends what a verb holds back with the next statement that must
follow it (the writes waiting for the gates with ``OPEN_GATES``, the write-back with the
COMMIT), so a claim that looks at its gates costs one round trip, and its gates are locked
from there to the COMMIT only; a completion goes as one statement per kind (its batch a
VALUES list). The conformance suite exercises every verb on both drivers
(``tests/store/conformance/test_driver.py``, ``test_complete.py``), and a census checks that
it does (``test_meta``).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from .asks import EventRow, EventsAsk, SignalAsk, SignalRow, Started, StartRuns
from .gaterows import GateLook, GateSettle, LineRun, Opened, Placing, by_line
from .records import record

if TYPE_CHECKING:
    from .dialect import ClaimRow
    from .limits import GateState
    from .types import Lease

__all__ = [  # the asks and rows of ``asks`` and ``gaterows`` are importable from here too
    "REFUSED",
    "VERBS",
    "Ack",
    "Advance",
    "CancelRow",
    "ClaimAsk",
    "Completed",
    "Completion",
    "Driver",
    "EventRow",
    "EventsAsk",
    "Fenced",
    "Finish",
    "GateLook",
    "GateSettle",
    "Handback",
    "Keep",
    "KeepRow",
    "LeaseRuns",
    "LineRun",
    "Opened",
    "Placing",
    "Release",
    "RenewAsk",
    "RenewRow",
    "SetState",
    "SignalAsk",
    "SignalRow",
    "StartRuns",
    "Started",
    "by_line",
]


@record
class Fenced:
    """A lease as every fenced write matches it (R2): its run, task, attempt and owner, and a
    live expiry (the write's own "now")."""

    run_id: int
    task_id: int
    attempt: int
    owner: str

    def params(self, now: float | None) -> dict[str, Any]:
        """Its fields as named statement parameters, with ``now``."""
        return {**vars(self), "now": now}


@record
class Finish(Fenced):
    """The run's state moves at ``revision`` (R5) and the run succeeds with ``result``; its
    task is done (JSON as text)."""

    revision: int
    state: str
    result: str


@record
class Advance(Fenced):
    """The run's state moves at ``revision``, its task is done, and its next task ``name``
    (``payload``) is due after ``delay``, in its gates' line if it has limits (``line``,
    ``gate_a``..``gate_c``, ``tokens``); ``queue``: the run moves there (None: stays)."""

    revision: int
    state: str
    queue: str | None
    name: str
    payload: str
    delay: float
    line: str | None = None
    gate_a: str | None = None
    gate_b: str | None = None
    gate_c: str | None = None
    tokens: int | None = None
    version: int | None = None  # the next task's version (B25; None: unversioned)


@record
class Release(Fenced):
    """The task goes back for another attempt after ``delay``, keeping ``error``."""

    delay: float
    error: str | None


@record
class Handback(Fenced):
    """A claimed task that never started goes back at once, its claim unspent (B3)."""


@record
class Ack(Fenced):
    """The task done (``Store.ack``); a run with no task left has succeeded."""


@record
class SetState(Fenced):
    """The run's state moves at ``revision`` (``Store.compare_and_set``, R5); the lease stays."""

    revision: int
    state: str


Completion = Finish | Advance | Release | Handback | Ack | SetState


class Completed(NamedTuple):
    """One completion's answer: whether it was written (its fence held and, for a
    compare-and-set, its revision), and whether it ended its run (a finish; an ack of the
    run's last task)."""

    written: bool
    ended: bool = False


REFUSED = Completed(False)


class CancelRow(NamedTuple):
    """A cancel's run: its status and queue before, whether this cancel ended it (False: it
    was over already) and the live descendants it ended with it (``(queue, run_id)`` each,
    in the order they were cancelled)."""

    status: str
    queue: str
    cancelled: bool
    descendants: list[tuple[str, int]]


@record
class Keep:
    """A paid call's answer to keep (B13): call ``name`` (``request_hash``) of step ``task_id``
    of run ``run_id`` answered ``result`` (JSON text), paid by ``attempt`` of ``owner`` using
    ``tokens``; ``intent``: the intent it answers (None: none was recorded)."""

    run_id: int
    task_id: int
    name: str
    request_hash: str
    result: str
    attempt: int
    owner: str
    tokens: int | None = None
    intent: int | None = None


class KeepRow(NamedTuple):
    """What a keep did: ``kept`` (this answer), ``lost_race`` (an answer was kept first: its
    ``result``, ``attempt`` and ``tokens``; this one is counted on it as paid, unused),
    ``answered`` (the intent was answered already: a keep retried after its first try
    landed; nothing written) or ``none`` (nothing is kept: the run is over or the step
    done)."""

    outcome: str
    result: str | None = None
    attempt: int | None = None
    tokens: int | None = None


@record
class ClaimAsk:
    """A plain claim (R1): up to ``limit`` leases of runs in no line, for ``owner``, in the
    served ``queues`` (None: all but ``skip``); ``start``: whether each begins at once (B3);
    ``tasks``: only runs whose next task is one of these (None: any, B22).
    ``task``: only runs whose head is a task of this name (a batch's claim)."""

    owner: str
    ttl: float
    limit: int
    queues: tuple[str, ...] | None = None
    skip: tuple[str, ...] = ()
    start: bool = True
    tasks: tuple[str, ...] | None = None
    task: str | None = None


@record
class LeaseRuns:
    """Lease the head task of each of ``run_ids`` (admitted by their gates) for ``owner``."""

    run_ids: tuple[int, ...]
    owner: str
    ttl: float
    start: bool = True


@record
class RenewAsk:
    """R3 for every lease of one ``owner``: ``starting`` (task ids among them) begin on this
    renewal's answer (B3)."""

    leases: tuple[Lease, ...]
    owner: str
    ttl: float
    starting: tuple[int, ...] = ()


class RenewRow(NamedTuple):
    """A lease renewed: its new expiry, and whether its run is still alive (B15)."""

    task_id: int
    attempt: int
    expires_at: float
    alive: bool


class Driver(abc.ABC):
    """The verbs a write transaction offers (the module's docstring)."""

    @abc.abstractmethod
    def claim_rows(self, ask: ClaimAsk) -> list[ClaimRow]:
        """Lease up to ``ask.limit`` claimable tasks of runs in no line, each of its own run,
        in the claim's order (R1, B6); a row whose ``task_id`` is None is a run locked but
        not leased (its head is newer than the statement's snapshot)."""

    @abc.abstractmethod
    def lease_runs(self, ask: LeaseRuns) -> list[ClaimRow]:
        """Lease the head task of each run admitted by its gates, as ``claim_rows`` does (a
        run whose head moved or that another claimer leased meanwhile has no row or a row
        without ``task_id``)."""

    @abc.abstractmethod
    def complete(self, batch: Sequence[Completion]) -> list[Completed]:
        """Each completion of ``batch`` (N >= 1, of distinct runs), each fenced and judged on
        its own, answered in order. Those of one kind go together (a driver may send them as
        one statement); the kinds go in the order they first appear."""

    @abc.abstractmethod
    def cancel_run(self, run_id: int) -> CancelRow | None:
        """Hold run ``run_id`` (its row locked where the engine has row locks), then, if it
        is live, cancel it (a pending run reopens its line first: it may close it, B12) and
        its live descendants. None: there is no such run."""

    @abc.abstractmethod
    def keep_call(self, keep: Keep) -> KeepRow:
        """Answer ``keep.intent`` (once), then keep the answer while the run is alive and the
        step not done, the first answer winning (a later one counted on it)."""

    @abc.abstractmethod
    def renew_leases(self, ask: RenewAsk) -> list[RenewRow]:
        """Each lease of ``ask`` that is still its owner's and live gets
        ``max(old, now + ttl)``; a lease not renewed has no row (lost or expired)."""

    @abc.abstractmethod
    def settle_gates(self, settles: Sequence[GateSettle]) -> None:
        """Write each settle to its gate (in the order given: sort them by gate), after the
        transaction's earlier gate writes and before its next ``open_gates`` or its COMMIT;
        ``open_gates`` then reads those gates with them (``Opened.held``)."""

    @abc.abstractmethod
    def place_gates(self, placing: Placing) -> None:
        """Create the gates the transaction's new runs name and open the lines they joined,
        after every gate write made before (a claim's ``write_gates`` too) and before the
        transaction's next ``open_gates`` or its COMMIT."""

    @abc.abstractmethod
    def reopen_runs(self, run_ids: Sequence[int]) -> None:
        """Runs made due by this transaction (a parent whose last child ended): their lines
        may admit them now. Ordered like ``settle_gates``."""

    @abc.abstractmethod
    def open_gates(
        self, queues: Sequence[str] | None, want: int, limit: int,
        tasks: Sequence[str] | None = None,
    ) -> Opened:  # fmt: skip
        """Up to ``limit`` gates whose line may admit a run now, the one served least
        recently first, locked (another claimer skips them), after the gate writes waiting;
        with ``want`` > 0, the states of the gates this transaction settled and up to
        ``want`` runs of their lines in the served ``queues`` (None: all) whose head task is
        one of the served ``tasks`` (None: any) as well."""

    @abc.abstractmethod
    def look_gates(
        self, gates: Sequence[str], lines: Sequence[str] = (),
        queues: Sequence[str] | None = None, limit: int = 0,
        tasks: Sequence[str] | None = None,
    ) -> GateLook:  # fmt: skip
        """The states of ``gates`` (which this claim holds) and the first ``limit`` runs of
        each of ``lines`` in the served ``queues`` and ``tasks``, locked, read together."""

    @abc.abstractmethod
    def write_gates(self, states: Sequence[GateState], now: float) -> None:
        """Write back the gates a claim changed (``states``, in name order) before the
        COMMIT, after the gate writes made before it: nothing later in the transaction
        reads them, so a driver may send them with the COMMIT."""

    @abc.abstractmethod
    def start_runs(self, ask: StartRuns) -> list[Started]:
        """Insert each run of ``ask`` with its first task and its ``run.enqueued`` event,
        answered in order; a run whose key names a run that exists (or an earlier run of the
        batch) inserts nothing and answers that run. A debounced run first gives its payload
        and start to its key's run while that one is pending and never claimed. Gated runs
        join their lines (their gates created, the lines opened) before the next statement."""

    @abc.abstractmethod
    def signal(self, ask: SignalAsk) -> SignalRow:
        """Keep the signal while the run is live (its row locked where the engine has row
        locks), then deliver it if the run waits for it now: its task due at once, its line
        (if gated) may admit it. A run that is over or missing keeps nothing (no raise: the
        row says which). The ``run.signalled`` event is the caller's."""

    @abc.abstractmethod
    def read_events(self, ask: EventsAsk) -> list[EventRow]:
        """The events ``ask`` names, in id order (on an engine whose ids are not handed out
        in commit order, those numbered so far: ``Dialect.ordered_events``)."""


# The verbs every driver implements (the census: ``tests/store/conformance/test_meta.py``).
VERBS = tuple(sorted(Driver.__abstractmethods__))
