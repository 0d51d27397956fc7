"""``supervisor web`` as a process: options and their ranges (also from the environment), one
line and an exit code for every error a user can cause, a taken port, serving and stopping on
TERM, and a dashboard that starts and serves while another process holds the write lock."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sv_harness import env_with_tests
from web_process import WebProcess

from workerproc.store import open_store

pytestmark = pytest.mark.slow


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = str(tmp_path / "lk.db")
    store = open_store(path)
    store.start_run("t")
    store.close()
    return path


@pytest.fixture
def procs() -> Iterator[list[WebProcess]]:
    started: list[WebProcess] = []
    yield started
    for proc in started:
        proc.kill()


def run_web(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor", "web", *args],
        capture_output=True, text=True, timeout=60, check=False,
        env={**env_with_tests(), **(env or {})},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "env", "code", "says"),
    [
        (["--port", "70000"], {}, 2, "--port"),
        (["--port", "-1"], {}, 2, "--port"),
        ([], {"SUPERVISOR_WEB_PORT": "99999"}, 2, "--port"),
        (["--refresh", "0"], {}, 2, "--refresh"),
        (["--refresh", "nan"], {}, 2, "--refresh"),
        (["--token", "short"], {}, 2, "--token"),
        (["--host", "no such host.invalid"], {}, 2, "--host"),
        (["--db", "/nonexistent/dir/lk.db"], {}, 1, "does not exist"),
    ],
)
def test_bad_input_is_one_line_and_an_exit_code(
    db: str, args: list[str], env: dict[str, str], code: int, says: str
) -> None:
    argv = args if "--db" in args else ["--db", db, *args]
    if "--port" not in args and "SUPERVISOR_WEB_PORT" not in env:
        argv += ["--port", "0"]  # a case that passed the checks must not take port 8000
    done = run_web(*argv, env=env)
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("supervisor: error:"), done.stderr
    assert says in lines[0]


def test_a_taken_port_is_one_line(db: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_web("--db", db, "--port", str(port))
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"supervisor: error: cannot listen on 127.0.0.1:{port}: the port is in use"
    )


def test_serves_on_loopback_and_stops_on_term(
    db: str, tmp_path: Path, procs: list[WebProcess]
) -> None:
    web = WebProcess(tmp_path, "--db", db, env={"SUPERVISOR_WEB_PORT": "0"})
    procs.append(web)
    assert web.url().startswith("http://127.0.0.1:")
    status, html = web.get("/runs")
    assert status == 200 and 'href="/runs/1"' in html
    assert web.get("/runs/2")[0] == 404
    assert web.stop() == 0
    assert "Traceback" not in web.stderr()


def test_the_token_from_the_environment_guards_every_request(
    db: str, tmp_path: Path, procs: list[WebProcess]
) -> None:
    env = {"SUPERVISOR_WEB_TOKEN": "s3cret-token", "SUPERVISOR_WEB_READ_ONLY": "1"}
    web = WebProcess(tmp_path, "--db", db, "--port", "0", env=env)
    procs.append(web)
    web.url()
    assert "read-only, token required" in web.out.read_text()
    assert web.get("/")[0] == 401
    status, html = web.get("/runs/1", {"Authorization": "Bearer s3cret-token"})
    assert status == 200 and "read-only" in html and 'method="post"' not in html


def test_starts_and_serves_while_another_process_holds_the_write_lock(
    db: str, tmp_path: Path, procs: list[WebProcess]
) -> None:
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        web = WebProcess(tmp_path, "--db", db, "--port", "0")
        procs.append(web)
        for path in ("/", "/runs", "/runs/1", "/leases"):
            assert web.get(path)[0] == 200, path
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_the_supervisor_never_imports_the_web_stack() -> None:
    """``supervisor start`` forks with no thread: the CLI loads the dashboard lazily."""
    probe = (
        "import sys, supervisor.commands.cli; "
        "print(sorted({'starlette', 'uvicorn', 'jinja2'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    assert done.stdout.strip() == "[]"
