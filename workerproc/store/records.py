"""``record``: the decorator of the values the store hands out.

A record is a frozen dataclass to the type checker (``dataclass_transform`` with
``frozen_default``: mypy rejects any assignment to a field) and a plain one at run time, equal
and hashable as a frozen one is (``unsafe_hash``), copied with ``dataclasses.replace`` as
before, and read by ``vars`` (no slots). Nothing stops an assignment at run time that no type
checker saw, so a value shared beyond one reader and reached by users' code is a frozen
dataclass instead (``types.TaskOptions``). What mypy does not see either: a ``del`` of a field
and an attribute that is no field set in a record's method (both pass, and succeed at run time),
and a ``dataclass(frozen=True)`` subclass of a record (it passes, and raises TypeError at
import: a frozen dataclass cannot inherit a plain one).

Why not ``dataclass(frozen=True)``: making a class is a ``compile`` per generated method, and a
frozen one has six (its ``__setattr__`` and ``__delattr__`` besides ``__init__``, ``__repr__``,
``__eq__`` and ``__hash__``) against four. Every command line call, supervisor and worker
makes about seventy of these at import, and they were half of a one-run command's time
(``supervisor show``: 60-100 ms of 150-200 on the 2-core VM, by a timer around
``dataclasses``' class processing; about 40 % less as records). A frozen class's
``__init__`` also sets each field through ``object.__setattr__``: 3 us for a ``Lease``'s 24
fields against 1 us, and a worker builds several records per run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar, dataclass_transform

_T = TypeVar("_T")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: type[_T]) -> type[_T]:
    """``cls`` as a record: frozen to the type checker, a plain hashable dataclass at run time."""
    return dataclass(unsafe_hash=True)(cls)
