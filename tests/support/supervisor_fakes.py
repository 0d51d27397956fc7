"""The supervisor without processes: fake spawn/kill/waitpid for a Pool, a fake store gate,
and a pool and an arbiter built on them with a fake clock."""

from __future__ import annotations

import dataclasses
from typing import Any

from helpers import FakeClock

from supervisor.config import StartConfig, Timing
from supervisor.loop.arbiter import Arbiter
from supervisor.loop.pool import Pool
from supervisor.loop.signals import SignalInbox
from supervisor.loop.steps import default_steps
from workerproc import App
from workerproc.config import WorkerConfig
from workerproc.status import StatusBoard
from workerproc.store import StoreUnavailable


def exited(code: int) -> int:
    return code << 8  # a waitpid status for "exited with code"


def killed(signum: int) -> int:
    return signum


class FakeProcs:
    """Spawner, kill and waitpid for a Pool, with no process at all."""

    def __init__(self) -> None:
        self.next_pid = 1000
        self.spawned: list[tuple[int, int, int | None]] = []  # pid, slot, max_tasks
        self.sent: list[tuple[int, int]] = []
        self.exits: list[tuple[int, int]] = []  # what waitpid returns next

    def spawn(self, slot: int, max_tasks: int | None) -> tuple[int, str]:
        self.next_pid += 1
        self.spawned.append((self.next_pid, slot, max_tasks))
        return self.next_pid, f"host:{self.next_pid}:1.00:abcd"

    def kill(self, pid: int, signum: int) -> None:
        self.sent.append((pid, signum))

    def waitpid(self, pid: int, options: int) -> tuple[int, int]:
        return self.exits.pop(0) if self.exits else (0, 0)


class FakeGate:
    file: str | None = None  # a server database: no file to check or pin

    def __init__(self) -> None:
        self.released: list[str] = []  # owners whose leases were released
        self.counted: list[str] = []  # owners whose leases were only counted
        self.held: dict[str, int] = {}  # live leases per owner (none unless a test says so)
        self.fail = False

    def release_owners(self, owners: list[str]) -> dict[str, int]:
        if self.fail:
            raise StoreUnavailable("database is locked")
        self.released += owners
        return {o: self.held.pop(o, 0) for o in owners}

    def lease_counts(self, owners: list[str]) -> dict[str, int]:
        if self.fail:
            raise StoreUnavailable("database is locked")
        self.counted += owners
        return {o: self.held.get(o, 0) for o in owners}

    def stats(self) -> Any:
        raise AssertionError("not used")


def make_pool(clock: FakeClock, procs: FakeProcs, target: int = 2) -> Pool:
    return Pool(
        procs.spawn,
        timing=Timing(),
        capacity=8,
        clock=clock,
        kill=procs.kill,
        waitpid=procs.waitpid,
        target=target,
    )


def make_arbiter(clock: FakeClock, procs: FakeProcs, **config: Any) -> Arbiter:
    config.setdefault("workers", 1)  # one worker unless a test asks for more, on any machine
    worker_fields = {f.name for f in dataclasses.fields(WorkerConfig)}
    mine = {k: v for k, v in config.items() if k in worker_fields}
    rest = {k: v for k, v in config.items() if k not in worker_fields}
    cfg = StartConfig(WorkerConfig(db="x.db", app="m:app", **mine), **rest).validate()
    return Arbiter(
        config=cfg,
        app=App(),
        pool=make_pool(clock, procs, cfg.workers),
        inbox=SignalInbox(),
        gate=FakeGate(),  # type: ignore[arg-type]
        board=StatusBoard(8),
        clock=clock,
        steps=default_steps(),
    )
