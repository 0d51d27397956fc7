"""Schedules kept in the database and fired (B16), written once.

Declarations: every worker writes its app's schedules when it starts (only what differs), like
limits; a host that declares a schedule otherwise than another host did is told so, and the new
declaration wins (its next tick counts from now).

Firing: any worker on any host may fire a due schedule; exactly one run starts per tick. A
firing is ONE write transaction: it reads the schedule's row (locked on PostgreSQL), checks that
``next_at`` is still the tick the firer saw due, inserts the runs of the due ticks (each with the
idempotency key ``schedule:<name>:<tick>``) and moves ``next_at`` past now by a compare-and-set
on the ``next_at`` it read. A second firer of the same tick finds ``next_at`` moved and starts
nothing; one killed mid-way committed nothing. What ``catch_up`` does after downtime is
``store.schedules.due``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..dialect import Dialect, Row, Tx
from ..newrun import NewRun
from ..schedules import (
    MAX_SCHEDULES,
    Fired,
    ScheduleInfo,
    ScheduleSpec,
    check_schedule_name,
    due,
    next_tick,
    tick_key,
)
from ..types import DEFAULT_QUEUE, Run
from .limits import Limits
from .producers import insert

DUE_BATCH = 100  # due schedules one look reads at most (the next look takes the rest)


def _info(row: Row) -> ScheduleInfo:
    (name, cron, tz, task, payload, queue, priority, catch_up, next_at, last_tick, last_run,
     fired, _declared, by, at) = row  # fmt: skip
    return ScheduleInfo(name, cron, tz, task, payload, queue, int(priority), catch_up,
                        float(next_at), last_tick, None if last_run is None else int(last_run),
                        int(fired), by, float(at))  # fmt: skip


class Schedules(Limits):
    dialect: Dialect
    if TYPE_CHECKING:

        def get_run(self, run_id: int) -> Run | None: ...  # ``Reads``

    def declare_schedules(self, specs: Mapping[str, ScheduleSpec], by: str) -> list[str]:
        """Write the schedules an app declares (``by``: who declares, for the record); returns
        a line for each schedule another host had declared otherwise (this declaration wins).
        A new or changed schedule's first tick is its first one after now."""
        if len(specs) > MAX_SCHEDULES:
            raise ValueError(f"an app declares at most {MAX_SCHEDULES} schedules")
        told: list[str] = []

        def write(tx: Tx) -> list[str]:
            held = {row[0]: row for row in tx.rows("SCHEDULE_ROWS", {})}
            now = tx.time()
            for name, spec in sorted(specs.items()):
                check_schedule_name(name)
                declared = spec.declared
                row = held.get(name)
                if row is not None and json.loads(row[12]) == declared:
                    continue  # the same declaration: its next tick and history stay
                if row is not None and row[13] != by:
                    before = json.loads(row[12])
                    told.append(f"schedule {name!r}: {by} declares {_shown(declared)}, {row[13]} "
                                f"had declared {_shown(before)}; the new one applies")  # fmt: skip
                tx.count("DECLARE_SCHEDULE", {
                    "name": name, "cron": spec.cron, "tz": spec.tz, "task": spec.task,
                    "payload": spec.payload, "queue": spec.queue or DEFAULT_QUEUE,
                    "priority": spec.priority or 0,
                    "catch_up": spec.catch_up, "next_at": next_tick(spec.cron, spec.tz, now),
                    "declared": json.dumps(declared, sort_keys=True), "by": by, "now": tx.now,
                })  # fmt: skip
            return told

        return self.dialect.write(write)

    def drop_schedule(self, name: str) -> bool:
        """Forget schedule ``name`` (until an app declares it again); False: there was none."""
        check_schedule_name(name)
        return bool(self.dialect.write(lambda tx: tx.count("DROP_SCHEDULE", {"name": name})))

    def schedules(self) -> list[ScheduleInfo]:
        """Every schedule, by name, with its last run's status."""
        rows = self.dialect.read(lambda tx: tx.rows("SCHEDULE_ROWS", {}))
        out = []
        for info in map(_info, rows):
            run = None if info.last_run is None else self.get_run(info.last_run)
            out.append(dataclasses.replace(info, last_status=run.status if run else None))
        return out

    def next_schedule_at(self) -> float | None:
        """The earliest next tick of every schedule (None: there is no schedule)."""
        row = self.dialect.read(lambda tx: tx.one("NEXT_SCHEDULE", {}))
        return None if row is None or row[0] is None else float(row[0])

    def fire_schedules(self) -> list[Fired]:
        """Fire every due schedule, each in its own transaction; what this caller fired (a
        tick another firer took first is not in it)."""
        looked = self.dialect.read(
            lambda tx: tx.rows("SCHEDULES_DUE", {"now": tx.now, "limit": DUE_BATCH})
        )
        fired = []
        for name, next_at in looked:
            done = self.fire_schedule(name, float(next_at))
            if done is not None:
                fired.append(done)
        return fired

    def fire_schedule(self, name: str, expected: float) -> Fired | None:
        """Fire schedule ``name`` if its next tick is still ``expected`` and due: its due
        ticks' runs and its next tick, in one transaction. None: nothing to fire (another
        firer moved it, it is not due, or it is gone)."""
        keeper = self.gatekeeper()

        def write(tx: Tx) -> Fired | None:
            row = tx.one("SCHEDULE_ROW", {"name": name})
            if row is None or float(row[8]) != expected:
                return None  # gone, or another firer took this tick
            s = _info(row)
            ticks, next_at = due(s.cron, s.tz, s.catch_up, s.next_at, tx.time())
            if next_at == s.next_at:
                return None  # not due yet
            base = NewRun.make(s.task, None, None, 0, None, s.queue, s.priority)
            base = dataclasses.replace(base, payload=s.payload)
            if keeper.gated(s.task):
                base = base.gated(keeper.of(s.task, json.loads(s.payload)))
            runs = [dataclasses.replace(base, key=tick_key(s.name, t)) for t in ticks]
            ids = insert(tx, runs) if runs else []
            moved = tx.count("SCHEDULE_FIRE", {
                "name": name, "expected": expected, "next_at": next_at,
                "tick": ticks[-1] if ticks else None, "run_id": ids[-1] if ids else None,
                "count": len(ids),
            })  # fmt: skip
            if moved != 1:  # the row lock (or the write lock) makes this impossible
                raise RuntimeError(f"schedule {name!r}: next_at moved under a firing")
            return Fired(name, ticks, ids, next_at)

        return self.dialect.write(write, intent="start")


def _shown(declared: Mapping[str, object]) -> str:
    shown = sorted((k, v) for k, v in declared.items() if v is not None and k != "payload")
    return ", ".join(f"{k}={v}" for k, v in shown)
