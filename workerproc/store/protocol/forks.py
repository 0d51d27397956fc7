"""Fork from a step (docs/protocol.md B24), written once: a new run that begins at step N of
another run, with the state that step was entered with (or one given), in one write
transaction that reads the source and writes nothing of it.

- A step is a task of the run, numbered from 1 in the order the run entered them (task id
  order): the first task is step 1, the task its advance wrote step 2, and so on. Each task
  keeps what its step was entered with (``tasks.input_state``, ``tasks.input_queue``), written
  by the statement that writes the task (a start's ``INSERT_RUNS``, an advance's ``ADVANCE``).
- The new run's one task is a copy of step N's (its name, payload and version, B25: the input
  state is written for that version; a migration moves both), due now, in the queue
  the step was entered in, at the source's priority, with no key; it is gated like any new run
  of its task; ``run.enqueued`` and ``run.forked`` (``from_run``, ``from_step``) are its events.
- Paid calls (B13) are keyed by their step: the fork's steps are new steps, so they find none
  of the source's kept answers and their ``once_key`` is new (step N onwards is new work); the
  steps before N are not run again (their answers were paid once, and what they made of them
  reaches the fork as step N's input state).
- ``ForkRefused``: the run never entered step N, or entered it before inputs were kept (give
  the state then), or it is one of leasekeeper's own runs. ``RunNotFound``: no such run.

A program (``programs``): the sync store and the async store run this same one.
"""

from __future__ import annotations

from collections.abc import Callable

from ..codec import RESERVED, dumps
from ..dialect import Dialect, Tx
from ..errors import ForkRefused, InvalidOption, RunNotFound
from ..newrun import NewRun
from ..traceparent import current_traceparent
from ..types import JSON
from .events import event_row, inserted
from .limits import Limits
from .producers import inserting
from .programs import Program, drive

MAX_STEP = 10**9  # a step number at most (a run of more steps than this is not forked)

Gate = Callable[[NewRun], NewRun]  # what a new run's task limits make of it


def fork_args(run_id: object, from_step: object, state: JSON) -> tuple[int, int, str | None]:
    """The fork's run id, step and state (JSON text; None: the step's own), checked before any
    transaction begins: ``RunNotFound`` for what cannot be a run id, ``InvalidOption`` for a
    step out of its range, ``InvalidPayload`` for a state beyond the payload limits."""
    if isinstance(run_id, bool) or not isinstance(run_id, int):
        raise RunNotFound(run_id)
    if (
        isinstance(from_step, bool)
        or not isinstance(from_step, int)
        or not (1 <= from_step <= MAX_STEP)
    ):
        raise InvalidOption(
            f"a fork's step must be a whole number from 1 to {MAX_STEP:,} (got {from_step!r})"
        )
    return run_id, from_step, None if state is None else dumps(state, "the fork's state")


def forking(
    run_id: int, step: int, state: str | None, traceparent: str | None, gate: Gate,
    now: float | None,
) -> Program[int]:  # fmt: skip
    """Read step ``step`` of run ``run_id`` and start the new run from it: its id."""
    rows = yield "FORK_SOURCE", {"run_id": run_id, "step": step}
    if not rows:
        raise RunNotFound(run_id)
    _, entered, name, payload, kept, queue, priority, version = rows[0]
    if name is None:
        raise ForkRefused(
            f"run {run_id} never entered step {step} (it entered {int(entered)} "
            f"step{'' if int(entered) == 1 else 's'})"
        )
    if str(name).startswith(RESERVED):
        raise ForkRefused(f"run {run_id} is one of leasekeeper's own runs: it cannot be forked")
    if state is None and kept is None:
        raise ForkRefused(
            f"run {run_id} entered step {step} before steps kept the state they were entered "
            "with: give the state to fork with (state=..., --state JSON)"
        )
    new = gate(NewRun(str(name), str(payload), state if state is not None else str(kept), 0.0,
                      None, str(queue), int(priority), traceparent=traceparent,
                      version=None if version is None else int(version)))  # fmt: skip
    (new_id,) = yield from inserting([new])
    forked = {"from_run": run_id, "from_step": step}
    yield from inserted([event_row("run.forked", new_id, new.task, None, forked)], now)
    return new_id


class Forks(Limits):
    dialect: Dialect

    def fork(self, run_id: int, from_step: int, state: JSON = None) -> int:
        """Start a new run from step ``from_step`` (1: the run's first task) of run ``run_id``:
        its task is a copy of that step's (name, payload), due now, in the queue that step was
        entered in, and its state is the state the source had when it entered the step, or
        ``state`` when given. Returns the new run's id; the source is left as it is (nothing
        of it is written). Paid calls (``ctx.once``) are kept per step: the new run's steps
        pay anew, the steps before ``from_step`` do not run again (docs/protocol.md B24).
        ``RunNotFound``; ``ForkRefused`` for a step the run never entered, one entered before
        steps kept their input (give ``state``) or a run of leasekeeper's own;
        ``InvalidOption``/``InvalidPayload`` for a bad step or state."""
        run, step, text = fork_args(run_id, from_step, state)
        keeper = self.gatekeeper()  # fresh before the transaction (it may read)
        traceparent = current_traceparent()

        def gate(new: NewRun) -> NewRun:
            return keeper.runs([new])[0]

        def write(tx: Tx) -> int:
            return drive(forking(run, step, text, traceparent, gate, tx.now), tx)

        return self.dialect.write(write)


def ungated(new: NewRun) -> NewRun:
    """A fork's run as it is (the async store gates none of its starts: the claim does)."""
    return new
