"""Runs that wait (B14), written once: the wait commit and signals, kept until a wait of their
name takes them, each delivered to one wait.

A wait is the run's next task stored pending but not due: its ``available_at`` is the wait's
deadline (``now + timeout``, or ``now + WAIT_FOREVER``), so the claim index never reaches it
before then; a waiting run holds no lease and no slot and is never polled. The run row says
what it waits for (``wait_for``: ``signal:NAME``), until when (``wait_until``) and on which
task (``wait_task``); the reads call such a run ``waiting``. A signal is a row of ``signals``:
``DELIVER_SIGNAL`` pairs the oldest kept signal of the name with the waiting task, makes the
task due now and records the signal on it (the claim hands it to the handler as
``ctx.signal``), and ends the wait, all under the run's lock. It runs when a signal is sent and
right after a wait commit, so a signal sent before the wait is kept and delivered when it
waits, whatever its timeout (the wait commit takes a kept signal even at a deadline of now:
``timeout=0``). A wait whose deadline passed takes no signal sent after it: its task is claimed
with none (``ctx.signal is None``), and a signal sent then is kept for a later wait.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..asks import SignalAsk, SignalRow
from ..codec import MAX_PAYLOAD, can_exist, check_name, dumps, loads
from ..dialect import Dialect, Params, Tx
from ..errors import RunNotFound, RunOver
from ..newrun import NewRun
from ..types import JSON, TERMINAL_STATUSES, CasResult, Child, Signal, SignalInfo
from .events import event_row, inserted
from .producers import insert
from .programs import Program, drive


def wait(tx: Tx, params: Params) -> CasResult:
    """The wait commit after its ADVANCE matched (the next task not due before the deadline):
    the run waits, and a signal it was sent already is delivered at once."""
    tx.count("MARK_WAIT", params)
    # ``fresh``: this wait's own commit takes a kept signal even when its deadline is now
    # (timeout 0): a signal sent before the wait is delivered, whatever the timeout
    tx.count("DELIVER_SIGNAL", {"run_id": params["run_id"], "now": tx.now, "fresh": True})
    return CasResult.OK


def spawn(tx: Tx, params: Params, children: Sequence[NewRun]) -> CasResult:
    """The spawn commit after its ADVANCE matched (the join task not due): the parent waits
    for its children, started here, in the same fenced transaction (a refused commit starts
    none), each knowing its parent, the join task and its place; no children: the join is due
    at once."""
    run_id = params["run_id"]
    tx.count("MARK_WAIT", params)
    ids = insert(tx, list(children)) if children else []
    tx.count("LINK_CHILDREN", {"parent": run_id, "children": ids, "now": tx.now})
    if not ids:
        tx.count("JOIN_DUE", {"run_id": run_id, "now": tx.now})
    return CasResult.OK


def ended_children(tx: Tx, run_ids: Sequence[int]) -> None:
    """Runs that just ended: each child's parent waits for one less; the last one's end
    makes the parent's join task due, and its line (if gated) may admit it now: a write to
    gates, ordered with the transaction's others (``Tx.reopen_runs``)."""
    due = []
    for run_id in run_ids:
        due += tx.rows("CHILD_ENDED", {"run_id": run_id, "now": tx.now})
    tx.reopen_runs([int(row[0]) for row in due])


def joined(tx: Tx, run_id: int, task_id: int) -> tuple[Child, ...]:
    """The children the join task ``task_id`` of run ``run_id`` waited for, in spawn order."""
    rows = tx.rows("CHILDREN_OF", {"run_id": run_id, "task_id": task_id})
    return tuple(Child(int(r[0]), str(r[1]), loads(r[2], f"run {r[0]}'s result"), r[3])
                 for r in rows)  # fmt: skip


def delivered(tx: Tx, signal_id: int | None) -> Signal | None:
    """The signal that resumed a claimed task's wait, or None (no wait, or it timed out)."""
    if signal_id is None:
        return None
    row = tx.one("GET_SIGNAL", {"signal_id": signal_id})
    if row is None:
        return None
    return Signal(str(row[0]), loads(row[1], f"signal {signal_id}'s payload"), float(row[2]))


class Waits:
    dialect: Dialect

    def signal(self, run_id: int, name: str, payload: JSON = None) -> int:
        """Send signal ``name`` (with a JSON ``payload``) to run ``run_id``: kept until the run
        waits for it (``ctx.wait_for(name, ...)``), then delivered to that one wait, whose next
        task runs at once with it as ``ctx.signal``. Returns the signal's id. ``RunNotFound``
        for an unknown run, ``RunOver`` for a finished one: nothing is kept."""
        ask = signal_ask(run_id, name, payload)
        return self.dialect.write(lambda tx: send(tx, ask), runs=[run_id])

    def run_children(self, run_id: int, limit: int = 100) -> list[tuple[int, str, str | None]]:
        """The runs this run spawned, oldest first: each one's id, status and first task."""
        params = {"run_id": run_id, "limit": max(1, int(limit))}
        rows = self.dialect.read(lambda tx: tx.rows("RUN_CHILDREN", params))
        return [(int(r[0]), str(r[1]), r[2]) for r in rows]

    def run_signals(self, run_id: int, limit: int = 20) -> list[SignalInfo]:
        """The run's signals, newest first: each with the task whose wait it resumed (None:
        kept, no wait has taken it yet)."""
        if not can_exist(run_id):
            return []
        params = {"run_id": run_id, "limit": max(1, int(limit))}
        rows = self.dialect.read(lambda tx: tx.rows("RUN_SIGNALS", params))
        return [SignalInfo(int(r[0]), str(r[1]), loads(r[2], f"signal {r[0]}'s payload"),
                           float(r[3]), r[4]) for r in rows]  # fmt: skip


def signal_ask(run_id: int, name: str, payload: JSON) -> SignalAsk:
    """A signal, checked and encoded before any transaction starts."""
    if isinstance(run_id, bool) or not isinstance(run_id, int):
        raise RunNotFound(run_id)
    return SignalAsk(run_id, check_name(name, "signal name"),
                     dumps(payload, "signal payload", MAX_PAYLOAD))  # fmt: skip


def send(tx: Tx, ask: SignalAsk) -> int:
    """``sending`` on a ``Tx`` (the sync store)."""
    return drive(sending(ask, tx.now), tx)


def sending(ask: SignalAsk, now: float | None) -> Program[int]:
    """The driver's ``signal``, then its ``run.signalled`` event; a program (``programs``):
    the sync and the async store run this same one. ``RunNotFound``, ``RunOver``: nothing
    was kept."""
    sent: SignalRow = yield ask
    if sent.signal_id is None:
        raise refusal(ask.run_id, sent)
    yield from inserted([signal_event(ask, sent)], now)
    return sent.signal_id


def signal_event(ask: SignalAsk, sent: SignalRow) -> Params:
    """A kept signal's ``run.signalled`` event."""
    event = {"name": ask.name, "signal": sent.signal_id, "resumed": sent.resumed}
    return event_row("run.signalled", ask.run_id, None, None, event)


def refusal(run_id: int, sent: SignalRow) -> RunNotFound | RunOver:
    """Why a signal was not kept: no such run, or the run is over."""
    if sent.status is None:
        return RunNotFound(run_id)
    return RunOver(run_id, sent.status if sent.status in TERMINAL_STATUSES else "over")
