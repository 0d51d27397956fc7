"""A rolling deploy (B22): two releases of an app run side by side on one database. The old
release's workers never claim a task only the new release has (a renamed task, a new step):
such runs wait, shown as "no worker serves task X", and spend no attempt; none fails. Once the
new release's pool runs, every run finishes, the old release's runs included (the renamed
task's alias serves them), and the old pool drains and stops."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from cli_runner import invoke
from helpers import wait_for
from procs import Proc, spawn_worker

from workerproc.store import open_store


@pytest.mark.slow
def test_old_workers_leave_the_new_release_s_runs_to_the_new_workers(
    db: str, workdir: Path, procs: list[Proc]
) -> None:
    store = open_store(db)
    old = spawn_worker(db, workdir, "--app", "apps.deploy_v1:app", "--concurrency", "4",
                       name="old")  # fmt: skip
    procs.append(old)
    wait_for(lambda: [w for w in store.workers() if w.pid == old.pid and w.tasks], timeout=30)
    before = [store.start_run("summarize", {"n": n}) for n in range(5)]  # the old release's
    after = [store.start_run("summarise", {"n": n}) for n in range(20)]  # the new release's
    wait_for(lambda: all(store.get_run(r).status == "succeeded" for r in before), timeout=60)
    assert {store.get_run(r).state["by"] for r in before} == {"v1"}  # type: ignore[index,union-attr]
    # the old pool claims none of the new runs: they wait, told why, no attempt spent
    assert all(t.attempts == 0 for r in after for t in store.get_tasks(r))
    shown = json.loads(invoke("runs", "--db", db, "--json").stdout)
    waiting = {r["id"]: r for r in shown if r["id"] in after}
    assert {(r["status"], r["waiting_for"]) for r in waiting.values()} == {
        ("waiting", "no worker serves task summarise")}  # fmt: skip
    assert "no worker serves task summarise" in invoke("runs", "--db", db).stdout
    assert "no worker serves task summarise" in invoke("show", str(after[0]), "--db", db).stdout

    more_old = [store.start_run("summarize", {"n": n}) for n in range(5, 10)]  # still coming
    new = spawn_worker(db, workdir, "--app", "apps.deploy_v2:app", "--concurrency", "4",
                       name="new")  # fmt: skip
    procs.append(new)
    everything = before + after + more_old
    wait_for(lambda: all(store.get_run(r).status == "succeeded" for r in after), timeout=90)
    old.signal(signal.SIGTERM)  # the old release goes: its pool drains and stops
    assert old.wait(60) == 0
    wait_for(lambda: all(store.get_run(r).status == "succeeded" for r in everything), timeout=90)
    runs = [store.get_run(r) for r in everything]
    assert [r.status for r in runs if r is not None] == ["succeeded"] * len(everything)
    assert {r.state["by"] for r in runs if r is not None and r.id in after} == {"v2"}  # type: ignore[index]
    # the new runs each ran once per step, on the new release's workers only
    for run_id in after:
        assert [(t.name, t.attempts) for t in store.get_tasks(run_id)] == [
            ("summarise", 1), ("publish", 1)]  # fmt: skip
    assert store.unserved(everything) == {}
    new.signal(signal.SIGTERM)
    assert new.wait(60) == 0
    store.close()


@pytest.mark.slow
def test_a_rolling_deploy_with_a_new_task_version_fails_no_run(
    db: str, workdir: Path, procs: list[Proc]
) -> None:
    """B25: the old pool (``translate`` at version 1) and the new one (version 2, migrating
    from 1) share one database. The old pool never claims a run the new release started; the
    new pool migrates each old run it takes once; none fails, and once the old pool stops
    every run has finished."""
    from apps import versions_v1, versions_v2  # noqa: PLC0415 - the test apps' own modules

    store = open_store(db)
    old = spawn_worker(db, workdir, "--app", "apps.versions_v1:app", "--concurrency", "2",
                       name="old")  # fmt: skip
    procs.append(old)
    wait_for(lambda: [w for w in store.workers() if w.pid == old.pid and w.tasks], timeout=30)
    before = [versions_v1.translate.start(None, state={"n": n}, store=store) for n in range(10)]
    wait_for(lambda: all(store.get_run(r).status == "succeeded" for r in before), timeout=60)
    # the new release's first run, before any of its workers: the old pool leaves it, told why
    first = versions_v2.translate.start(None, state={"n": 99, "lang": "en"}, store=store)
    why = "no worker serves task translate version 2"
    wait_for(lambda: store.unserved([first]) == {first: why}, timeout=30)
    shown = {r["id"]: r for r in json.loads(invoke("runs", "--db", db, "--json").stdout)}
    assert (shown[first]["status"], shown[first]["waiting_for"]) == ("waiting", why)
    assert [t.attempts for t in store.get_tasks(first)] == [0]
    new = spawn_worker(db, workdir, "--app", "apps.versions_v2:app", "--concurrency", "2",
                       name="new")  # fmt: skip
    procs.append(new)
    more_old = [versions_v1.translate.start(None, state={"n": n}, store=store)
                for n in range(10, 20)]  # fmt: skip
    start_new = versions_v2.translate.start
    after = [first] + [start_new(None, state={"n": n, "lang": "en"}, store=store)
                       for n in range(100, 120)]  # fmt: skip
    wait_for(lambda: all(store.get_run(r).status == "succeeded" for r in after), timeout=90)
    old.signal(signal.SIGTERM)  # the old release goes: its pool drains and stops
    assert old.wait(60) == 0
    # the old release's producers still start runs at version 1: the new pool migrates them
    late = [versions_v1.translate.start(None, state={"n": n}, store=store) for n in range(20, 30)]
    everything = before + more_old + late + after
    wait_for(lambda: all(store.get_run(r).status == "succeeded" for r in everything), timeout=90)
    runs = {r: store.get_run(r) for r in everything}
    assert {run.status for run in runs.values() if run} == {"succeeded"}
    # the new release's runs ran on the new pool only, once each, never migrated
    assert {runs[r].state["by"] for r in after} == {"v2"}  # type: ignore[index,union-attr]
    assert all([t.attempts for t in store.get_tasks(r)] == [1] for r in after)
    # the old runs the new pool took were migrated once each; the others ran as they were
    older = before + more_old + late
    by_v2 = {r for r in older if runs[r].state["by"] == "v2"}  # type: ignore[index,union-attr]
    assert set(late) <= by_v2 and not by_v2 & set(before)
    assert all(runs[r].state["lang"] == "en" for r in by_v2)  # type: ignore[index,union-attr]
    assert all("lang" not in runs[r].state for r in set(older) - by_v2)  # type: ignore[operator,union-attr]
    assert all([t.version for t in store.get_tasks(r)] == [2] for r in by_v2)
    ledger = (workdir / "migrations.log").read_text().split()
    assert sorted(int(n) for n in ledger) == sorted(runs[r].state["n"] for r in by_v2)  # type: ignore[index,union-attr]
    migrated = [e.run_id for e in store.events(after=0, limit=10_000) if e.kind == "step.migrated"]
    assert sorted(migrated) == sorted(by_v2)
    assert store.unserved(everything) == {}
    new.signal(signal.SIGTERM)
    assert new.wait(60) == 0
    store.close()
