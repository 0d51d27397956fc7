"""Task versions and state migrations (B25), in-process on both backends: runs started at version
1 are upgraded once each by a version-2 worker, before its handler begins, however often the
task is tried or taken over; a version-1 worker never claims a run at version 2; a migration
that raises fails its task as a handler's error would."""

from __future__ import annotations

import collections
import json
import re
import signal
import threading
from typing import Any

import pytest
from cli_runner import invoke
from helpers import wait_for
from worker_fakes import worker

from workerproc import App, TaskContext, exitcodes
from workerproc.store import CasResult, open_store


def releases() -> tuple[App, App, list[int]]:
    """The app at version 1, and at version 2 with its migration; the migration's ledger (the
    run number each call upgraded)."""
    v1, v2, ledger = App(), App(), []

    @v1.task("summarise")
    def old(ctx: TaskContext) -> None:
        ctx.finish({**ctx.state, "by": "v1"})

    @v2.migrate("summarise", from_version=1)  # (declared above its task: attached when it is)
    def upgrade(state: Any) -> Any:
        ledger.append(state["n"])
        return {**state, "lang": "en"}

    @v2.task("summarise", version=2, max_attempts=3, retry_backoff=0.01)
    def new(ctx: TaskContext) -> None:
        assert ctx.state["lang"] == "en", "the handler reads the migrated state"
        if ctx.payload["flaky"] and ctx.tries == 1:
            raise RuntimeError("a first try that fails after the migration was written")
        ctx.finish({**ctx.state, "by": "v2", "revision": ctx.revision})

    return v1, v2, ledger


@pytest.mark.parametrize("slots", [1, 4])  # inline on the main thread; on slot threads
def test_a_v2_worker_upgrades_each_v1_run_once_across_retries_and_takeovers(
    db: str, slots: int
) -> None:
    v1, v2, ledger = releases()
    with open_store(db) as s:
        ids = [v1.tasks["summarise"].start({"flaky": n % 2 == 1}, state={"n": n}, store=s)
               for n in range(6)]  # fmt: skip
        # a zombie holds one of them at version 1, its lease about to lapse
        zombie = s.claim("host:9:1.0:zombie", 0.2, tasks=v2.served_tasks())
        assert zombie is not None and zombie.version == 1
        wait_for(lambda: s.now() > zombie.expires_at, timeout=10)
    w, _ = worker(db, v2, concurrency=slots)
    assert w.run() == exitcodes.OK
    with open_store(db) as s:
        runs = [s.get_run(i) for i in ids]
        assert [r.status for r in runs if r] == ["succeeded"] * 6
        assert [r.state for r in runs if r] == [
            {"n": n, "lang": "en", "by": "v2", "revision": 1} for n in range(6)]  # fmt: skip
        assert [[(t.name, t.version) for t in s.get_tasks(i)] for i in ids] == [
            [("summarise", 2)]] * 6  # fmt: skip
        tries = {i: s.get_tasks(i)[0].attempts for i in ids}
        migrated = [e.run_id for e in s.events(after=0) if e.kind == "step.migrated"]
        # the zombie wakes: its migration is refused by the fence
        assert s.migrate_state(zombie, 2, {"n": -1}) is CasResult.LEASE_LOST
    assert collections.Counter(ledger) == {n: 1 for n in range(6)}  # once per run
    assert sorted(migrated) == sorted(ids)
    assert tries[zombie.run_id] >= 2 and [tries[i] for i in ids[1::2]] >= [2, 2, 2]


def test_a_v1_worker_never_claims_a_run_at_version_2(db: str) -> None:
    v1, v2, _ = releases()
    with open_store(db) as s:
        newer = [v2.tasks["summarise"].start({"flaky": False}, state={"n": n}, store=s)
                 for n in range(3)]  # fmt: skip
        older = [v1.tasks["summarise"].start(None, state={"n": n}, store=s) for n in range(2)]
    w, spy = worker(db, v1)
    ran = threading.Thread(target=w.run, daemon=True)
    ran.start()
    with open_store(db) as s:
        wait_for(lambda: all(s.get_run(i).status == "succeeded" for i in older), timeout=30)  # type: ignore[union-attr]
        seen = len(spy.exchanges)
        wait_for(lambda: len(spy.exchanges) >= seen + 3, timeout=30)  # it looked again, thrice
        w.signals.stop = signal.SIGTERM
        ran.join(30)
        assert not ran.is_alive()
        assert [t.attempts for i in newer for t in s.get_tasks(i)] == [0, 0, 0]
        assert s.unserved(newer, tasks=v1.served_tasks()) == {
            i: "no worker serves task summarise version 2" for i in newer}  # fmt: skip
        assert s.unserved(newer, tasks=v2.served_tasks()) == {}


def test_a_migration_that_raises_fails_the_task_like_a_handler_error(db: str) -> None:
    app, called = App(), []

    @app.task("render", version=3, max_attempts=2, retry_backoff=0.01)
    async def render(ctx: TaskContext) -> None:  # (an async handler: migrated on its loop)
        called.append(ctx.state)
        ctx.finish(ctx.state)

    @app.migrate("render", from_version=2)
    def two(state: Any) -> Any:
        if state.get("broken"):
            raise ValueError("cannot read this state")
        return {**state, "three": True}

    @app.migrate("render", from_version=1)
    def one(state: Any) -> Any:
        return {**state, "two": True}

    with open_store(db) as s:
        bad = s.start_run("render", state={"broken": True}, version=1)
        good = s.start_run("render", state={}, version=1)
    w, _ = worker(db, app, concurrency=2)
    assert w.run() == exitcodes.OK
    with open_store(db) as s:
        failed, done = s.get_run(bad), s.get_run(good)
        assert failed is not None and failed.status == "failed"
        assert "ValueError: cannot read this state" in (failed.last_error or "")
        assert s.get_tasks(bad)[0].version == 1 and failed.state == {"broken": True}
        assert done is not None and done.status == "succeeded"
        assert done.state == {"two": True, "three": True}
    assert called == [{"two": True, "three": True}]  # the broken run's handler never ran


def test_enqueue_with_the_app_records_the_version_and_show_tells_it(db: str) -> None:
    versioned = invoke("enqueue", "translate", "--db", db, "--app", "apps.versions_v2:app")
    bare = invoke("enqueue", "translate", "--db", db)
    assert versioned.exit_code == 0 and bare.exit_code == 0, versioned.output + bare.output
    with open_store(db) as s:
        assert s.get_tasks(int(versioned.stdout))[0].version == 2
        assert s.get_tasks(int(bare.stdout))[0].version is None  # unversioned: any release
    shown = invoke("show", versioned.stdout.strip(), "--db", db)
    assert shown.exit_code == 0 and re.search(r"\btranslate\s.*\s2\s*$", shown.stdout, re.M), (
        shown.stdout
    )
    as_json = json.loads(invoke("show", bare.stdout.strip(), "--db", db, "--json").stdout)
    assert [t["version"] for t in as_json["tasks"]] == [None]
