"""Schedules (B16): ``declare_schedules``, ``fire_schedules``, ``next_schedule_at``,
``schedules``, ``drop_schedule``: one run per tick, and what a bad declaration raises."""

from __future__ import annotations

import pytest

from workerproc.store.schedules import MAX_SCHEDULES, ScheduleSpec, tick_key

from .kit import Driver, verb

EVERY_SECOND = "* * * * * *"


def declare(driver: Driver, by: str = "here", **kw: object) -> ScheduleSpec:
    spec = ScheduleSpec.declare(EVERY_SECOND, task="report", **kw)  # type: ignore[arg-type]
    assert driver.store.declare_schedules({spec.name: spec}, by=by) == []
    return spec


@verb("declare_schedules", "schedules", "next_schedule_at")
def test_a_declared_schedule_starts_at_its_next_tick(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    assert s.schedules() == [] and s.next_schedule_at() is None
    clock.now = 1_000_000.5
    declare(driver, payload={"a": 1}, queue="q", priority=2)
    (info,) = s.schedules()
    assert (info.name, info.task, info.queue, info.priority, info.payload) == (
        "report", "report", "q", 2, '{"a":1}')  # fmt: skip
    assert info.next_at == s.next_schedule_at() == 1_000_001.0
    assert (info.fired, info.last_run, info.declared_by) == (0, None, "here")


@verb("declare_schedules")
def test_another_hosts_declaration_is_told_and_too_many_refused(driver: Driver) -> None:
    s = driver.store
    declare(driver, by="a")
    spec = ScheduleSpec.declare("*/5 * * * * *", task="report")
    (told,) = s.declare_schedules({spec.name: spec}, by="b")
    assert "b declares" in told and s.schedules()[0].cron == "*/5 * * * * *"
    many = {f"s{i}": ScheduleSpec.declare(EVERY_SECOND, task="t", name=f"s{i}")
            for i in range(MAX_SCHEDULES + 1)}  # fmt: skip
    with pytest.raises(ValueError):
        s.declare_schedules(many, by="b")
    assert [i.name for i in s.schedules()] == ["report"]


@verb("fire_schedules")
def test_each_due_tick_starts_one_run(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    declare(driver, payload={"n": 1})
    assert s.fire_schedules() == []  # not due
    clock.now += 1.1
    (fired,) = s.fire_schedules()
    assert fired.name == "report" and len(fired.run_ids) == 1
    assert driver.open().fire_schedules() == []  # the tick is taken: no second run
    run = s.get_run(fired.run_ids[0])
    assert run is not None and run.key == tick_key("report", fired.ticks[0])
    assert driver.claim().payload == {"n": 1}
    (info,) = s.schedules()
    assert (info.fired, info.last_run, info.last_status) == (1, run.id, "running")


@verb("drop_schedule")
def test_a_dropped_schedule_fires_no_more(driver: Driver) -> None:
    s = driver.store
    declare(driver)
    assert s.drop_schedule("report") is True and s.drop_schedule("report") is False
    assert s.drop_schedule("never-was") is False
    driver.clock.advance(5)
    assert s.fire_schedules() == [] and s.schedules() == [] and s.next_schedule_at() is None


@verb("drop_schedule")
def test_drop_schedule_refuses_a_name_no_schedule_could_have(driver: Driver) -> None:
    """B9 (SQLite answered False for a NUL, PostgreSQL raised)."""
    declare(driver)
    for name in ("", "a\x00b", "bad name"):
        with pytest.raises(ValueError):
            driver.store.drop_schedule(name)
    assert [i.name for i in driver.store.schedules()] == ["report"]
