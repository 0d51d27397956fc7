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
