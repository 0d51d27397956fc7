"""A handler's own log records (``logging.getLogger(__name__)`` in a task) are written, at the
level the user chose (``--log-level``), and carry the run id, task, attempt and worker, in text
and in ``--log-format json``; records logged outside a handler carry none."""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sv_harness import Supervisor, env_with_tests

from supervisor import logs as supervisor_logs
from workerproc import logs
from workerproc.store import Lease, open_store

LEASE = Lease(7, 3, "talk", None, attempt=2, owner="w", expires_at=0.0, claimed_at=0.0)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    loggers = [logging.getLogger(n) for n in ("", "workerproc", "supervisor")]
    saved = [(lg, lg.handlers[:], lg.level, lg.propagate) for lg in loggers]
    yield
    for lg, handlers, level, propagate in saved:
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate
    logs.set_worker(None)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_record_logged_in_a_handler_carries_its_task(fmt: str, restore_logging: None) -> None:
    stream = io.StringIO()
    supervisor_logs.setup(fmt, stream)
    logs.set_worker(1)
    user = logging.getLogger("myapp.tasks")
    user.info("outside any handler")
    with logs.running(LEASE):
        user.info("calling the model")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    if fmt == "json":
        outside, inside = (json.loads(line) for line in lines)
        assert "run_id" not in outside and outside["event"] == "log"
        assert {k: inside[k] for k in ("run_id", "task_id", "task", "attempt", "worker")} == {
            "run_id": 3, "task_id": 7, "task": "talk", "attempt": 2, "worker": 1,
        }  # fmt: skip
        assert inside["level"] == "info" and inside["logger"] == "myapp.tasks"
        assert inside["msg"] == "calling the model"
    else:
        assert lines[0].endswith("] INFO outside any handler")  # no task tags
        tags = r"\[run_id=3 task_id=7 task=talk attempt=2 worker=1\]$"
        assert re.search(r"\d\d:\d\d:\d\d,\d+ supervisor\[\d+\] INFO calling the model " + tags,
                         lines[1])  # fmt: skip


def test_the_level_is_the_users_and_lifecycle_events_keep_their_own_fields(
    restore_logging: None,
) -> None:
    stream = io.StringIO()
    supervisor_logs.setup("json", stream, level="warning")
    user = logging.getLogger("myapp")
    with logs.running(LEASE):
        user.info("not shown")
        user.warning("shown")
        logs.event(logging.getLogger("workerproc.worker"), "task_failed", "x",
                   level=logging.WARNING, task_id=99)  # fmt: skip
    docs = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [d["msg"] for d in docs] == ["shown", "x"]
    assert docs[0]["run_id"] == 3 and docs[1]["task_id"] == 99 and "run_id" not in docs[1]
    with pytest.raises(ValueError, match="log level must be one of"):
        logs.level_of("loud")


def test_python_m_workerproc_takes_the_log_level(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "workerproc", "--db", str(tmp_path / "x.db"), "--app", "a:b",
         "--log-level", "loud"],
        capture_output=True, text=True, env=env_with_tests(), timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "--log-level must be one of debug, info" in done.stderr


def records(sv: Supervisor) -> list[dict[str, object]]:
    return [d for d in sv.events("log") if d.get("logger") == "apps.log_app"]


@pytest.mark.slow
def test_a_pool_writes_its_handlers_records_with_their_tasks_in_json(sv: Supervisor) -> None:
    ids = [sv.enqueue("talk") for _ in range(3)] + [sv.enqueue("talk_async") for _ in range(2)]
    sv.start("--drain", "--concurrency", "3", n=2, app="apps.log_app:app")
    assert sv.wait_exit(timeout=90) == 0, sv.text()
    found = records(sv)
    assert len(found) == 10, sv.text()  # info and warning of each run, no debug
    for doc in found:
        msg = str(doc["msg"])
        assert msg.endswith(f"from run {doc['run_id']}"), doc  # each record keeps its own run
        assert doc["run_id"] in ids and doc["attempt"] == 1 and isinstance(doc["worker"], int)
        assert doc["task"] == ("talk_async" if msg.startswith("async") else "talk")
        assert doc["level"] == ("warning" if "warning" in msg else "info")
    with open_store(sv.db) as store:
        assert store.stats().runs == {"succeeded": 5}


@pytest.mark.slow
def test_a_pool_at_debug_in_text_shows_the_debug_records_tagged(sv: Supervisor) -> None:
    run_id = sv.enqueue("talk")
    sv.start("--drain", "--log-format", "text", "--log-level", "debug", n=1,
             app="apps.log_app:app")  # fmt: skip
    assert sv.wait_exit(timeout=90) == 0, sv.text()
    text = sv.text()
    for level in ("DEBUG", "INFO", "WARNING"):
        line = next(li for li in text.splitlines() if f"{level.lower()} from run" in li)
        assert re.search(rf"worker\[\d+\] {level} {level.lower()} from run {run_id} "
                         rf"\[run_id={run_id} task_id=\d+ task=talk attempt=1 worker=0\]$",
                         line), line  # fmt: skip
