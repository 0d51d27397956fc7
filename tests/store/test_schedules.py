"""Schedules in the store (B16), on every backend, with the fake clock: declarations
kept and told apart, one run per tick by a compare-and-set on ``next_at`` (two firers racing,
and a firer that saw a tick another already took), catch_up after downtime, the keys."""

from __future__ import annotations

import threading

from helpers import FakeClock
from store_backends import Backend

from workerproc.store import Store, TaskOptions
from workerproc.store.limits import LimitSpec
from workerproc.store.schedules import MAX_CATCH_UP, ScheduleSpec, tick_key

EVERY_SECOND = "* * * * * *"


def declare(s: Store, cron: str = EVERY_SECOND, by: str = "here", **kw: object) -> ScheduleSpec:
    spec = ScheduleSpec.declare(cron, task=str(kw.pop("task", "report")), **kw)  # type: ignore[arg-type]
    assert s.declare_schedules({spec.name: spec}, by=by) == []
    return spec


def scheduled_keys(s: Store) -> list[str]:
    return sorted(
        r.key or "" for r in s.list_runs(limit=10_000) if (r.key or "").startswith("schedule:")
    )


class TestDeclarations:
    def test_a_schedule_starts_at_its_next_tick_and_keeps_it_when_declared_again(
        self, s: Store, clock: FakeClock
    ) -> None:
        clock.now = 1_000_000.5
        declare(s, payload={"a": 1}, tz="Europe/Berlin")
        (info,) = s.schedules()
        assert (info.name, info.task, info.tz) == ("report", "report", "Europe/Berlin")
        assert info.next_at == 1_000_001.0
        assert (info.last_tick, info.last_run, info.fired) == (None, None, 0)
        assert info.payload == '{"a":1}'
        clock.advance(5)
        declare(s, payload={"a": 1}, tz="Europe/Berlin", by="there")  # the same: nothing moves
        assert s.schedules()[0].next_at == 1_000_001.0 and s.schedules()[0].declared_by == "here"

    def test_another_hosts_other_declaration_is_told_and_wins(
        self, s: Store, clock: FakeClock
    ) -> None:
        declare(s, by="host-a")
        clock.advance(10.2)
        spec = ScheduleSpec.declare("*/5 * * * * *", task="report", catch_up="all")
        told = s.declare_schedules({spec.name: spec}, by="host-b")
        assert len(told) == 1 and "host-b declares" in told[0] and "host-a had declared" in told[0]
        (info,) = s.schedules()
        assert (info.cron, info.catch_up, info.declared_by) == ("*/5 * * * * *", "all", "host-b")
        assert info.next_at == 1_000_015.0  # the new cron's next tick after now

    def test_a_dropped_schedule_fires_no_more(self, s: Store, clock: FakeClock) -> None:
        declare(s)
        assert s.drop_schedule("report") and not s.drop_schedule("report")
        clock.advance(5)
        assert s.fire_schedules() == [] and s.schedules() == [] and s.next_schedule_at() is None


class TestFiring:
    def test_each_tick_starts_one_run_with_its_key_payload_and_queue(
        self, s: Store, clock: FakeClock
    ) -> None:
        s.register_tasks({"report": TaskOptions(queue="reports")})
        spec = ScheduleSpec.declare(EVERY_SECOND, task="report", payload={"n": 1},
                                    queue="reports", priority=3)  # fmt: skip
        s.declare_schedules({"report": spec}, by="here")
        assert s.fire_schedules() == []  # not due yet
        assert s.next_schedule_at() == 1_000_001.0
        for i in range(1, 4):
            clock.now = 1_000_000.0 + i + 0.1
            (fired,) = s.fire_schedules()
            assert fired.ticks == [1_000_000.0 + i] and fired.next_at == 1_000_001.0 + i
            assert s.fire_schedules() == []  # the same tick again: nothing
        run = s.get_run(fired.run_ids[0])
        assert run is not None and run.key == tick_key("report", 1_000_003.0)
        assert (run.task, run.queue, run.priority) == ("report", "reports", 3)
        lease = s.claim("w", 30, queues=["reports"])
        assert lease is not None and lease.payload == {"n": 1}
        (info,) = s.schedules()
        assert (info.fired, info.last_tick, info.last_run) == (3, 1_000_003.0, run.id)
        assert len(scheduled_keys(s)) == 3

    def test_a_firer_that_saw_a_tick_another_took_starts_nothing(
        self, s: Store, backend: Backend, clock: FakeClock
    ) -> None:
        declare(s)
        clock.advance(1.5)
        other = backend.open(clock)
        try:
            assert other.fire_schedule("report", 1_000_001.0) is not None  # took the tick
            assert s.fire_schedule("report", 1_000_001.0) is None  # saw it due: CAS refuses
        finally:
            other.close()
        assert scheduled_keys(s) == [tick_key("report", 1_000_001.0)]

    def test_two_firers_racing_start_exactly_one_run_per_tick(
        self, backend: Backend, clock: FakeClock
    ) -> None:
        first = backend.open(clock)
        declare(first)
        first.close()
        ticks, firers = 15, 2
        gate = threading.Barrier(firers, timeout=30)
        won: list[list[float]] = [[] for _ in range(firers)]
        errors: list[BaseException] = []
        lock = threading.Lock()
        step = threading.Barrier(firers, action=lambda: clock.advance(1.0), timeout=30)

        def fire(i: int) -> None:
            store = backend.open(clock)  # its own connection, in its own thread
            try:
                gate.wait()
                for _ in range(ticks):
                    step.wait()  # the clock moved one tick: both fire at once
                    for fired in store.fire_schedules():
                        with lock:
                            won[i].extend(fired.ticks)
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                store.close()

        threads = [threading.Thread(target=fire, args=(i,)) for i in range(firers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        every = sorted(won[0] + won[1])
        assert every == [1_000_001.0 + i for i in range(ticks)]  # each tick once, none missed
        check = backend.open(clock)
        try:
            assert len(scheduled_keys(check)) == ticks
            assert check.schedules()[0].fired == ticks
        finally:
            check.close()

    def test_a_gated_task_scheduled_joins_its_limits_line(self, s: Store, clock: FakeClock) -> None:
        s.register_tasks({"report": TaskOptions(limits=("one",))})
        s.declare_limits({"one": LimitSpec.declare("one", concurrency=1)}, by="here")
        declare(s, catch_up="all")
        clock.advance(2.5)
        (fired,) = s.fire_schedules()
        assert len(fired.run_ids) == 2
        assert len(s.claim("w", 30, limit=5)) == 1  # the cap holds for scheduled runs too


class TestCatchUp:
    def test_after_downtime_skip_one_and_all(self, s: Store, clock: FakeClock) -> None:
        for mode in ("skip", "one", "all"):
            declare(s, name=f"r-{mode}", catch_up=mode)
            declare(s, "0 0 * * * *", name=f"hourly-{mode}", catch_up=mode)  # at 14:00:00
        clock.advance(10.5)  # ticks 1 .. 10 came due while nobody fired
        fired = {f.name: f for f in s.fire_schedules()}
        assert fired["r-all"].ticks == [1_000_000.0 + i for i in range(1, 11)]
        assert fired["r-one"].ticks == [1_000_010.0]  # one run for the missed ticks
        assert fired["r-skip"].ticks == [1_000_010.0]  # the newest is on time: it runs
        assert {f.next_at for f in fired.values()} == {1_000_011.0}
        clock.advance(3600)  # an hour down (the clock reads 14:46:50)
        fired = {f.name: f for f in s.fire_schedules()}
        assert len(fired["r-all"].run_ids) == MAX_CATCH_UP  # capped: the newest 1,000
        assert fired["r-all"].ticks[-1] == 1_003_610.0
        assert fired["r-one"].ticks == fired["r-skip"].ticks == [1_003_610.0]
        hourly = 1_000_800.0  # 14:00:00, 46 minutes late
        assert fired["hourly-skip"].ticks == fired["hourly-skip"].run_ids == []  # skipped
        assert fired["hourly-one"].ticks == fired["hourly-all"].ticks == [hourly]
        nexts = {i.name: i.next_at for i in s.schedules()}
        assert nexts["hourly-skip"] == nexts["hourly-one"] == hourly + 3600
        assert s.fire_schedules() == []
        assert len(scheduled_keys(s)) == 10 + 1 + 1 + MAX_CATCH_UP + 1 + 1 + 1 + 1
