"""The CLI against careless input: arguments that are not UTF-8, and what the
environment may and may not decide. Real processes: a shell hands ``$'\\xff'`` to the
program as the byte 0xff, which Python keeps as a lone surrogate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sv_harness import env_with_tests

from workerproc.store import open_store

pytestmark = pytest.mark.slow


def supervisor(
    *args: str | bytes, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    environ = {**env_with_tests(), **(env or {})}
    return subprocess.run([sys.executable, "-m", "supervisor", *args], capture_output=True,
                          timeout=60, check=False, env=environ)  # fmt: skip


@pytest.fixture
def db(sqlite_db: str) -> str:
    """SQLite only: what these tests pin does not depend on the backend."""
    return sqlite_db


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["enqueue", "fast", "--key", b"\xff"], "argument 4 ('\\xff')"),
        (["enqueue", b"task\xff"], "argument 2 ('task\\xff')"),
        (["enqueue", "fast", "--queue", b"q\xc3"], "argument 4 ('q\\xc3')"),
        (["enqueue", "fast", "--payload", b'"\xff"'], "argument 4 ('\"\\xff\"')"),
        (["runs", "--queue", b"\xff"], "argument 3 ('\\xff')"),
        (["runs", "--status", b"\xfe\xff"], "argument 3 ('\\xfe\\xff')"),
        (["show", b"1\xff"], "argument 2 ('1\\xff')"),
    ],
)
def test_an_argument_that_is_not_utf8_is_one_line_and_exit_2(
    db: str, args: list[str | bytes], shown: str
) -> None:
    done = supervisor(*args[:2], *args[2:], "--db", db)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("supervisor: error: ") and shown in err and "not valid UTF-8" in err
    with open_store(db) as store:
        assert store.list_runs() == []  # nothing was written


def test_a_variable_that_is_not_utf8_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {k: v for k, v in env_with_tests().items()}
    environ = {k.encode(): v.encode() for k, v in env.items()}
    environ[b"SUPERVISOR_DB"] = str(tmp_path).encode() + b"/\xfe.db"
    done = subprocess.run([sys.executable, "-m", "supervisor", "runs"], capture_output=True,
                          timeout=60, check=False, env=environ)  # type: ignore[arg-type]  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 2 and err.count("\n") == 1, err
    assert "SUPERVISOR_DB ('" in err and "\\xfe.db') is not valid UTF-8" in err
    assert os.listdir(tmp_path) == []  # no file was made under any name


@pytest.mark.parametrize(
    ("args", "env"),
    [([b"--db", b"DIR/\xff.db"], {}), ([b"--db", b"DIR/q.db", b"--queues", b"\xff"], {}),
     ([], {b"SUPERVISOR_DB": b"DIR/\xfe.db"})],
)  # fmt: skip
def test_the_standalone_worker_refuses_what_is_not_utf8_with_one_line(
    tmp_path: Path, args: list[bytes], env: dict[bytes, bytes]
) -> None:
    """``python -m workerproc`` takes the same text as ``supervisor``: its sqlite3 once raised
    UnicodeEncodeError (a traceback) on a path that is not UTF-8."""
    where = str(tmp_path).encode()
    environ = {k.encode(): v.encode() for k, v in env_with_tests().items()}
    environ.update({k: v.replace(b"DIR", where) for k, v in env.items()})
    argv = [a.replace(b"DIR", where) for a in args] + [b"--app", b"apps.basic:app"]
    done = subprocess.run([sys.executable.encode(), b"-m", b"workerproc", *argv],
                          capture_output=True, timeout=60, check=False, env=environ)  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 2 and err.count("\n") == 1, err
    assert err.startswith("python -m workerproc: error: ") and "is not valid UTF-8" in err
    assert os.listdir(tmp_path) == []


def test_text_that_is_utf8_is_taken_as_it_is(db: str) -> None:
    done = supervisor("enqueue", "tâche", "--key", "clé-1", "--queue", "llm-1", "--db", db)
    assert done.returncode == 0, done.stderr
    with open_store(db) as store:
        (run,) = store.list_runs()
        assert (run.task, run.key, run.queue) == ("tâche", "clé-1", "llm-1")


# -- what one call does never comes from the environment ---------------------------------------
def test_an_exported_key_payload_state_or_delay_is_not_read(db: str) -> None:
    """With SUPERVISOR_KEY=deploy-42 exported, two enqueues of different payloads both returned
    run 1, silently."""
    env = {"SUPERVISOR_KEY": "deploy-42", "SUPERVISOR_PAYLOAD": '{"from": "env"}',
           "SUPERVISOR_STATE": '{"from": "env"}', "SUPERVISOR_DELAY": "3600",
           "SUPERVISOR_PRIORITY": "9", "SUPERVISOR_STATUS": "failed",
           "SUPERVISOR_LIMIT": "1"}  # fmt: skip
    ids = [supervisor("enqueue", "t", "--db", db, "--payload", str(n), env=env) for n in (1, 2)]
    assert [d.returncode for d in ids] == [0, 0], [d.stderr for d in ids]
    assert [int(d.stdout) for d in ids] == [1, 2]
    with open_store(db) as store:
        runs = sorted(store.list_runs(), key=lambda r: r.id)
        assert [(r.key, r.state, r.priority) for r in runs] == [(None, {}, 0), (None, {}, 0)]
        assert store.next_ready_at() is not None and store.next_ready_at() <= store.now()  # type: ignore[operator]
    listed = supervisor("runs", "--db", db, "--json", env=env)
    assert listed.returncode == 0 and listed.stdout.count(b'"id"') == 2  # no status, no limit


def test_enqueue_reads_its_queue_from_its_own_variable_and_refuses_the_old_one(db: str) -> None:
    done = supervisor("enqueue", "t", "--db", db, env={"SUPERVISOR_ENQUEUE_QUEUE": "llm"})
    assert done.returncode == 0, done.stderr
    with open_store(db) as store:
        assert [r.queue for r in store.list_runs()] == ["llm"]
    old = supervisor("enqueue", "t", "--db", db, env={"SUPERVISOR_QUEUE": "llm"})
    err = old.stderr.decode()
    assert old.returncode == 2 and err.count("\n") == 1, err
    assert "SUPERVISOR_QUEUE is no longer read" in err and "SUPERVISOR_ENQUEUE_QUEUE" in err
    with open_store(db) as store:
        assert len(store.list_runs()) == 1  # nothing was started on a queue nobody meant


def test_the_database_and_the_pidfile_still_come_from_the_environment(db: str) -> None:
    done = supervisor("enqueue", "t", env={"SUPERVISOR_DB": db})
    assert done.returncode == 0 and done.stdout.strip() == b"1", done.stderr
    shown = supervisor("runs", env={"SUPERVISOR_DB": db})
    assert shown.returncode == 0 and b"pending" in shown.stdout


def test_a_database_error_that_spans_lines_is_one_line() -> None:
    """libpq puts a hint on a line of its own ("Is the server running on that host ...?"): the
    CLI prints one line, with the password masked, and a non-zero exit code."""
    done = supervisor("status", "--db", "postgresql://lk:hunter2@127.0.0.1:1/db?connect_timeout=2")
    err = done.stderr.decode()
    assert done.returncode != 0 and err.count("\n") == 1, err
    assert err.startswith("supervisor: error: ") and "Traceback" not in err
    assert "hunter2" not in err and "127.0.0.1" in err
