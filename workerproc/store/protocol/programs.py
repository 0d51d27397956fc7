"""Protocol steps written once, for every way of talking to a database: a *program* is a
generator that yields what it needs next and is sent the answer. A transaction's program yields
statements (a catalogue name and its parameters) and gets their rows, or asks for a driver verb
(``store/asks.py``: a start, a signal) and gets its typed answer; ``drive`` runs one on a
``Tx`` (the sync store: its verbs answer the asks), the async store sends the rows it awaited
(``store/aio.py``; an ask runs as its verb's program, ``store.starts.in_statements``). A wait's
program yields operations (read the run, watch it, read the change token, sleep on it); each
caller performs them its own way (``perform`` with plain functions here)."""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from typing import Any, TypeVar

from ..asks import Program, Statement
from ..dialect import Tx

Answer = TypeVar("Answer")
Operation = tuple[Any, ...]  # ("run", run_id), ("watch", run_id), ("token",), ("sleep", t, s)
Steps = Generator[Operation, Any, Answer]


def drive(program: Program[Answer], tx: Tx) -> Answer:
    """Run ``program`` on ``tx`` (``InTurn.run_program``): each statement it yields, its rows
    sent back; each ask, its verb's answer. Its events (``INSERT_EVENTS``) wait on ``tx`` with
    those of the other transitions, for ``Tx.flush``."""
    return tx.run_program(program)


__all__ = ["Answer", "Operation", "Program", "Statement", "Steps", "drive", "perform"]


def perform(steps: Steps[Answer], operations: Mapping[str, Callable[..., Any]]) -> Answer:
    """Run ``steps``: each operation it yields done by the function of its name."""
    try:
        op = next(steps)
        while True:
            op = steps.send(operations[op[0]](*op[1:]))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
