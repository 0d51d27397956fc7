"""Declaring limits and the task that uses them, in one store."""

from __future__ import annotations

from workerproc.store import Store, TaskOptions
from workerproc.store.limits import LimitSpec


def limited(s: Store, *limits: LimitSpec, task: str = "call", tokens: int | None = None) -> None:
    s.register_tasks({task: TaskOptions(limits=tuple(x.name for x in limits), tokens=tokens)})
    assert s.declare_limits({x.name: x for x in limits}, by="here") == []
