"""Schedules' values (B16) without a database: cron expressions and time zones
checked at declaration, the next tick and the due ticks from an injected "now" (cronsim in the
schedule's time zone, daylight saving time included), catch_up's three answers, the keys."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from workerproc import App
from workerproc.runner import AppLoadError, load_app
from workerproc.store.schedules import (
    MAX_CATCH_UP,
    ON_TIME,
    ScheduleSpec,
    due,
    next_tick,
    tick_key,
)

BERLIN = ZoneInfo("Europe/Berlin")
T0 = datetime(2027, 1, 15, 8, 0, 0, tzinfo=UTC).timestamp()  # a whole minute


def berlin(*args: int) -> float:
    return datetime(*args, tzinfo=BERLIN).timestamp()  # type: ignore[misc]


def local(t: float) -> str:
    return datetime.fromtimestamp(t, BERLIN).isoformat()


class TestNextTick:
    def test_every_second_and_every_five_minutes(self) -> None:
        assert next_tick("* * * * * *", "UTC", T0) == T0 + 1  # strictly after
        assert next_tick("* * * * * *", "UTC", T0 + 0.25) == T0 + 1
        assert next_tick("*/5 * * * *", "UTC", T0) == T0 + 300
        assert next_tick("*/5 * * * *", "UTC", T0 - 0.5) == T0

    def test_a_time_zone_moves_the_wall_clock_ticks(self) -> None:
        # 09:00 in Berlin is 08:00 UTC in winter (CET, +01:00)
        assert next_tick("0 9 * * *", "Europe/Berlin", T0 - 60) == T0
        assert next_tick("0 9 * * *", "UTC", T0 - 60) == T0 + 3600

    def test_spring_forward_runs_a_skipped_time_once_at_the_jump(self) -> None:
        # 2026-03-29 02:00 CET jumps to 03:00 CEST: 02:30 never happens; Debian cron (and
        # cronsim) runs it at 03:00, once, then the next day at 02:30 again
        t = next_tick("30 2 * * *", "Europe/Berlin", berlin(2026, 3, 29, 1, 0))
        assert local(t) == "2026-03-29T03:00:00+02:00"
        assert local(next_tick("30 2 * * *", "Europe/Berlin", t)) == "2026-03-30T02:30:00+02:00"

    def test_fall_back_runs_a_repeated_time_once(self) -> None:
        # 2026-10-25 03:00 CEST goes back to 02:00 CET: 02:30 happens twice, runs once
        t = next_tick("30 2 * * *", "Europe/Berlin", berlin(2026, 10, 25, 1, 0))
        assert local(t) == "2026-10-25T02:30:00+02:00"
        assert local(next_tick("30 2 * * *", "Europe/Berlin", t)) == "2026-10-26T02:30:00+01:00"

    def test_an_interval_keeps_its_real_spacing_across_the_change(self) -> None:
        t = berlin(2026, 10, 25, 1, 45)
        ticks = []
        for _ in range(5):
            t = next_tick("*/30 * * * *", "Europe/Berlin", t)
            ticks.append(t)
        assert [b - a for a, b in itertools.pairwise(ticks)] == [1800.0] * 4
        assert [local(x)[11:] for x in ticks] == [
            "02:00:00+02:00", "02:30:00+02:00", "02:00:00+01:00", "02:30:00+01:00",
            "03:00:00+01:00",
        ]  # fmt: skip


class TestDue:
    def test_nothing_is_due_before_the_tick(self) -> None:
        assert due("* * * * * *", "UTC", "all", T0, T0 - 0.1) == ([], T0)

    def test_on_time_every_mode_runs_the_tick(self) -> None:
        for mode in ("skip", "one", "all"):
            assert due("* * * * * *", "UTC", mode, T0, T0 + 0.2) == ([T0], T0 + 1)

    def test_after_downtime_skip_one_and_all(self) -> None:
        now = T0 + 9.5  # ticks T0 .. T0 + 9 were missed
        assert due("* * * * * *", "UTC", "all", T0, now) == (
            [T0 + i for i in range(10)], T0 + 10)  # fmt: skip
        assert due("* * * * * *", "UTC", "one", T0, now) == ([T0 + 9], T0 + 10)
        assert due("* * * * * *", "UTC", "skip", T0, now) == ([T0 + 9], T0 + 10)  # on time
        late = T0 + ON_TIME + 30.5  # the newest due tick is 30 s old: still on time
        assert due("* * * * *", "UTC", "skip", T0, late) == ([T0 + 60], T0 + 120)
        assert due("*/2 * * * *", "UTC", "skip", T0, late) == ([], T0 + 120)  # 90 s: skipped
        gone = T0 + 3 * 3600 + 1800  # an hourly schedule down for three and a half hours
        assert due("0 * * * *", "UTC", "skip", T0, gone) == ([], T0 + 4 * 3600)
        assert due("0 * * * *", "UTC", "one", T0, gone) == ([T0 + 3 * 3600], T0 + 4 * 3600)

    def test_all_runs_at_most_the_newest_thousand(self) -> None:
        ticks, after = due("* * * * * *", "UTC", "all", T0, T0 + 5000.5)
        assert len(ticks) == MAX_CATCH_UP
        assert ticks[0] == T0 + 5001 - MAX_CATCH_UP and ticks[-1] == T0 + 5000
        assert after == T0 + 5001

    def test_a_tick_key_names_the_schedule_and_the_tick_in_utc(self) -> None:
        assert tick_key("report", T0) == "schedule:report:2027-01-15T08:00:00Z"
        # the repeated 02:30 of a fall-back night: two instants, two keys
        first = berlin(2026, 10, 25, 2, 30)
        assert tick_key("r", first) == "schedule:r:2026-10-25T00:30:00Z"
        assert tick_key("r", first + 3600) == "schedule:r:2026-10-25T01:30:00Z"


class TestDeclare:
    def test_the_pinned_call_checks_and_keeps_its_values(self) -> None:
        app = App()

        @app.schedule("*/5 * * * *", task="report", payload={}, tz="Europe/Berlin",
                      catch_up="one")  # fmt: skip
        @app.task(queue="reports", priority=5)
        def report(ctx: object) -> None: ...

        spec = app.schedule_specs()["report"]
        assert (spec.cron, spec.tz, spec.task, spec.payload, spec.catch_up) == (
            "*/5 * * * *", "Europe/Berlin", "report", "{}", "one")  # fmt: skip
        assert (spec.queue, spec.priority) == ("reports", 5)  # the task's, unless given

    def test_a_decorator_without_task_schedules_the_decorated_task(self) -> None:
        app = App()

        @app.schedule("0 * * * *", catch_up="all")
        @app.task
        def hourly(ctx: object) -> None: ...

        assert app.schedule_specs()["hourly"].task == "hourly"

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            ({"cron": "*/5 * * *"}, "cron"),
            ({"cron": "61 * * * *"}, "cron"),
            ({"cron": ""}, "cron"),
            ({"tz": "Mars/Olympus"}, "time zone"),
            ({"catch_up": "some"}, "catch_up"),
            ({"payload": {"x": float("nan")}}, "payload"),
            ({"payload": "x" * (2 << 20)}, "payload"),
            ({"name": "no spaces"}, "name"),
            ({"queue": "bad queue"}, "queue"),
        ],
    )
    def test_bad_values_are_refused_at_declaration(
        self, args: dict[str, object], message: str
    ) -> None:
        call: dict[str, object] = {"cron": "* * * * *", "task": "t", **args}
        with pytest.raises(ValueError, match=message):
            ScheduleSpec.declare(**call)  # type: ignore[arg-type]

    def test_a_name_declared_twice_otherwise_is_refused(self) -> None:
        app = App()
        app.schedule("* * * * *", task="t")
        app.schedule("* * * * *", task="t")  # the same again: fine
        with pytest.raises(ValueError, match="name="):
            app.schedule("*/2 * * * *", task="t")
        app.schedule("*/2 * * * *", task="t", name="t-often")
        assert sorted(app.schedules) == ["t", "t-often"]

    def test_a_schedule_of_an_unregistered_task_fails_the_app_load(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: object
    ) -> None:
        import sys  # noqa: PLC0415
        import types  # noqa: PLC0415

        app = App()
        app.schedule("* * * * *", task="nowhere")
        module = types.ModuleType("sched_app_missing")
        module.app = app  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "sched_app_missing", module)
        with pytest.raises(AppLoadError, match="'nowhere', which the app does not register"):
            load_app("sched_app_missing:app")
