"""``supervisor web`` as a process: options and their ranges (also from the environment), one
line and an exit code for every error a user can cause, a taken port, serving and stopping on
TERM, and a dashboard that starts and serves while another process holds the write lock."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from sv_harness import env_with_tests
from web_process import WebProcess

from workerproc.store import open_store

pytestmark = pytest.mark.slow


@pytest.fixture
def db(sqlite_db: str) -> str:
    """SQLite only, with one run."""
    path = sqlite_db
    store = open_store(path)
    store.start_run("t")
    store.close()
    return path


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
        (["--token", " " * 8], {}, 2, "--token must be 16 to 1024 printable"),
        (["--token", " " * 20], {}, 2, "--token must be 16 to 1024 printable"),
        (["--token", "fifteen-chars-x"], {}, 2, "--token must be 16"),
        (["--token", "sixteen chars ok"], {}, 2, "without spaces"),
        ([], {"SUPERVISOR_WEB_TOKEN": " " * 16}, 2, "--token must be 16"),
        ([], {"SUPERVISOR_WEB_TOKEN": ""}, 2, "SUPERVISOR_WEB_TOKEN is set but empty"),
        ([], {"SUPERVISOR_WEB_TOKEN_FILE": ""}, 2, "SUPERVISOR_WEB_TOKEN_FILE is set but empty"),
        (["--token", "none"], {}, 2, "--token must be 16"),
        (["--token-file", "/nonexistent/token"], {}, 2, "--token-file /nonexistent/token: No such"),
        (["--token-file", "/dev/null"], {}, 2, "is not a regular file"),
        (["--token", "x" * 16, "--token-file", "/etc/hostname"], {}, 2, "not both"),
        (["--allowed-host", "http://dash.example.com"], {}, 2, "--allowed-host takes a host name"),
        (["--allowed-host", "*"], {}, 2, "--allowed-host takes a host name"),
        (["--allowed-host", "dash.example.com:443"], {}, 2, "--allowed-host takes a host name"),
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
    db: str, tmp_path: Path, web_procs: list[WebProcess]
) -> None:
    web = WebProcess(tmp_path, "--db", db, env={"SUPERVISOR_WEB_PORT": "0"})
    web_procs.append(web)
    assert web.url().startswith("http://127.0.0.1:")
    status, html = web.get("/runs")
    assert status == 200 and 'href="/runs/1"' in html
    assert web.get("/runs/2")[0] == 404
    assert web.stop() == 0
    assert "Traceback" not in web.stderr()


def test_the_token_from_the_environment_guards_every_request(
    db: str, tmp_path: Path, web_procs: list[WebProcess]
) -> None:
    env = {"SUPERVISOR_WEB_TOKEN": "s3cret-token-0123456", "SUPERVISOR_WEB_READ_ONLY": "1"}
    web = WebProcess(tmp_path, "--db", db, "--port", "0", env=env)
    web_procs.append(web)
    web.url()
    assert "read-only, token required" in web.out.read_text()
    assert web.get("/")[0] == 401
    status, html = web.get("/runs/1", {"Authorization": "Bearer s3cret-token-0123456"})
    assert status == 200 and "read-only" in html and 'method="post"' not in html


@pytest.mark.parametrize(
    ("content", "says"),
    [("", "the token must be 16"), ("        \n", "the token must be 16"),
     ("short\n", "the token must be 16"), ("\xff" * 20, "is not text"),
     ("x" * 5000, "larger than 4096 bytes")],
)  # fmt: skip
def test_a_token_file_that_holds_no_usable_token_is_one_line(
    db: str, tmp_path: Path, content: str, says: str
) -> None:
    path = tmp_path / "token"
    path.write_bytes(content.encode("latin-1"))
    done = run_web("--db", db, "--port", "0", "--token-file", str(path))
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr


@pytest.mark.parametrize("how", ["file", "file-from-env", "env"])
def test_the_token_and_the_url_can_stay_out_of_ps(
    db: str, tmp_path: Path, web_procs: list[WebProcess], how: str
) -> None:
    """``ps`` shows every process's arguments to every user: the token and the database URL
    come from a file or the environment instead (which only the process's user can read)."""
    token = "Tk-" + "9f3a" * 6
    path = tmp_path / "token"
    path.write_text(token + "\n")  # the first line, without its line break
    path.chmod(0o600)
    args = ["--port", "0"]
    env = {"SUPERVISOR_DB": db}
    if how == "file":
        args += ["--token-file", str(path)]
    elif how == "file-from-env":
        env["SUPERVISOR_WEB_TOKEN_FILE"] = str(path)
    else:
        env["SUPERVISOR_WEB_TOKEN"] = token
    web = WebProcess(tmp_path, *args, env=env)
    web_procs.append(web)
    web.url()
    cmdline = " ".join(psutil.Process(web.proc.pid).cmdline())
    assert token not in cmdline and db not in cmdline
    assert web.get("/")[0] == 401
    assert web.get("/", {"Authorization": f"Bearer {token}"})[0] == 200
    assert "token required" in web.out.read_text()


def test_starts_and_serves_while_another_process_holds_the_write_lock(
    db: str, tmp_path: Path, web_procs: list[WebProcess]
) -> None:
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        web = WebProcess(tmp_path, "--db", db, "--port", "0")
        web_procs.append(web)
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
