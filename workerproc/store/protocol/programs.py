"""Protocol steps written once, for every way of talking to a database: a *program* is a
generator that yields what it needs next and is sent the answer. A transaction's program yields
statements (a catalogue name and its parameters) and gets their rows; ``drive`` runs one on a
``Tx`` (the sync store), the async store sends the rows it awaited (``store/aio.py``). A wait's
program yields operations (read the run, watch it, read the change token, sleep on it); each
caller performs them its own way (``perform`` with plain functions here)."""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from typing import Any, TypeVar

from ..dialect import Params, Row, Tx

Answer = TypeVar("Answer")
Statement = tuple[str, Params]  # a catalogue name and its parameters
Program = Generator[Statement, list[Row], Answer]  # a transaction's body, one statement at a time
Operation = tuple[Any, ...]  # ("run", run_id), ("watch", run_id), ("token",), ("sleep", t, s)
Steps = Generator[Operation, Any, Answer]


def drive(program: Program[Answer], tx: Tx) -> Answer:
    """Run ``program`` on ``tx``: each statement it yields, its rows sent back. Its events
    (``INSERT_EVENTS``) wait on ``tx`` with those of the other transitions, for ``Tx.flush``."""
    try:
        name, params = next(program)
        while True:
            if name == "INSERT_EVENTS":
                tx.events.extend(params["events"])
                name, params = program.send([])
                continue
            name, params = program.send(tx.rows(name, params))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def perform(steps: Steps[Answer], operations: Mapping[str, Callable[..., Any]]) -> Answer:
    """Run ``steps``: each operation it yields done by the function of its name."""
    try:
        op = next(steps)
        while True:
            op = steps.send(operations[op[0]](*op[1:]))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
