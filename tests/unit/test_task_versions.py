"""``@app.task(version=N)`` and ``@app.migrate(task, from_version=k)`` (B25), checked when the
app is defined or loaded: versions in range, migrations below their task's version, no gap in a
chain; what a worker serves follows."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from workerproc import App, TaskContext
from workerproc.loading import AppLoadError, load_app
from workerproc.store.webhooks import DELIVERY_TASK


def handler(ctx: TaskContext) -> None: ...


def keep(state: Any) -> Any:
    return state


@pytest.mark.parametrize("version", [0, -1, 1_000_001, 1.5, "2", True, None])
def test_a_version_out_of_range_is_refused_at_import(version: object) -> None:
    app = App()
    if version is None:  # (None: not given, version 1)
        assert app.task("t")(handler).version == 1
        return
    with pytest.raises(ValueError, match=r"version must be a whole number from 1 to 1,000,000"):
        app.task("t", version=version)(handler)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"from_version must be a whole number"):
        app.migrate("t", from_version=version)(keep)  # type: ignore[arg-type]


def test_a_migration_from_the_task_s_version_or_above_is_refused() -> None:
    app = App()
    app.task("t", version=2)(handler)
    with pytest.raises(ValueError, match=r"from_version=2\): task 't' is at version 2"):
        app.migrate("t", from_version=2)(keep)
    early = App()  # declared before its task: refused when the task comes
    early.migrate("t", from_version=3)(keep)
    with pytest.raises(ValueError, match=r"from_version=3\): task 't' is at version 2"):
        early.task("t", version=2)(handler)


def test_a_gap_in_the_chain_is_refused_when_the_app_is_checked() -> None:
    app = App()
    app.task("t", version=4)(handler)
    app.migrate("t", from_version=1)(keep)
    app.migrate("t", from_version=3)(keep)
    with pytest.raises(ValueError, match=r"no migration from version 2: declare "
                                         r"@app.migrate\('t', from_version=2\)"):  # fmt: skip
        app.served_tasks()
    app.migrate("t", from_version=2)(keep)
    assert app.check_versions()["t"] == (1, 4)


def test_a_migration_of_a_task_the_app_does_not_register_is_refused() -> None:
    app = App()
    app.task("t")(handler)
    app.migrate("typo", from_version=1)(keep)
    with pytest.raises(ValueError, match=r"@app.migrate\('typo'\): the app registers no task"):
        app.check_versions()


def test_a_migration_declared_twice_or_on_a_batch_step_is_refused() -> None:
    app = App()
    app.task("t", version=2)(handler)
    app.migrate("t", from_version=1)(keep)
    with pytest.raises(ValueError, match="declared twice"):
        app.migrate("t", from_version=1)(lambda state: state)
    batch = App()
    batch.task("b", version=2, batch=8)(handler)
    batch.migrate("b", from_version=1)(keep)
    with pytest.raises(ValueError, match="a batch step's runs are not migrated"):
        batch.check_versions()


def test_a_worker_serves_each_version_its_chain_reaches_and_unversioned_runs() -> None:
    app = App()
    app.task("summarise", version=3, aliases=["summarize"])(handler)
    app.migrate("summarize", from_version=2)(keep)  # by its alias: the same task
    app.task("plain")(handler)
    app.task("fresh", version=2)(handler)  # no migration: its version-1 runs are not its own
    assert set(app.served_tasks()) == {
        DELIVERY_TASK, "plain", "plain@1", "fresh", "fresh@2",
        "summarise", "summarise@2", "summarise@3", "summarize", "summarize@2", "summarize@3",
    }  # fmt: skip
    assert app.tasks["summarise"].migrations == {2: keep}
    assert "version=3" in repr(app.tasks["summarise"])


def test_load_app_says_what_is_wrong_with_a_chain(tmp_path: Path, monkeypatch: Any) -> None:
    (tmp_path / "gappy_app.py").write_text(
        "from workerproc import App\napp = App()\n"
        "@app.task(version=3)\ndef t(ctx): ...\n"
        "@app.migrate('t', from_version=1)\ndef up(state): return state\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    match = r"gappy_app:app: task 't' \(version 3\) migrates from version 1 but has no migration"
    with pytest.raises(AppLoadError, match=match):
        load_app("gappy_app:app")
    sys.modules.pop("gappy_app", None)
