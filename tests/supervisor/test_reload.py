"""Reload with the real supervisor: its own app module written here, a real NOTIFY_SOCKET, and
``supervisor reload --wait`` as an operator (or systemd's ExecReload) runs it.

- a good reload returns 0 only once every worker runs the new generation and READY=1 was sent
  again, and the supervisor itself never imports the new code;
- a slow import: RELOADING=1 comes before it finishes, the loop keeps pinging the watchdog and
  reaping meanwhile, ``--timeout`` gives up with one line, and a second HUP starts over;
- a syntax error: exit 11 with the error line, STATUS says so, health stays 0, the old workers
  serve until a good reload;
- new workers that cannot boot (exit 3, or an import that fails only in them): exit 11, the
  supervisor keeps running on the old workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers import wait_for
from notify_fakes import Listener
from sv_harness import Supervisor, env_with_tests

from supervisor import exitcodes
from supervisor.integrations.notify import ENV_SOCKET, ENV_WATCHDOG_USEC
from supervisor.loop.pidfile import read_state
from workerproc.store import open_store

pytestmark = pytest.mark.slow
MODULE = "rlapp"


def app_source(version: str, imports_log: Path, extra: str = "") -> str:
    """An app whose every import is logged as "pid version"; ``extra`` runs after that."""
    return "\n".join(
        [
            "import os, time",
            "from workerproc import App",
            f"VERSION = {version!r}",
            f"with open({str(imports_log)!r}, 'a') as fh:",
            "    fh.write(f'{os.getpid()} {VERSION}\\n')",
            extra,
            "app = App()",
            "",
            "@app.task('version')",
            "def version(ctx):",
            "    return {'version': VERSION}",
            "",
        ]
    )


def slow_until(release: Path) -> str:
    """Import-time code that waits (bounded) until ``release`` exists."""
    return (
        "deadline = time.monotonic() + 60\n"
        f"while not os.path.exists({str(release)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)"
    )


def second_import_fails(imports_log: Path, how: str) -> str:
    """Import-time code: the first import of this version (the probe) passes, later ones fail."""
    return (
        f"if sum(1 for l in open({str(imports_log)!r}) if l.split()[1] == VERSION) > 1:\n    {how}"
    )


class Setup:
    """The app module, rewritten per version. Versions differ in length on purpose: a .pyc is
    trusted when the source's size and mtime (in seconds) match, and a rewrite within the same
    second must not look unchanged."""

    def __init__(self, sv: Supervisor, tmp_path: Path) -> None:
        self.sv = sv
        self.code = tmp_path / "code"
        self.code.mkdir()
        self.imports = tmp_path / "imports.log"
        self.module = self.code / f"{MODULE}.py"
        sv.extra_path = str(self.code)

    def write(self, version: str, extra: str = "") -> None:
        self.module.write_text(app_source(version, self.imports, extra))

    def importers(self, version: str) -> list[int]:
        lines = self.imports.read_text().split("\n") if self.imports.exists() else []
        return [int(p) for p, v in (ln.split() for ln in lines if ln) if v == version]

    def cli(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        env = env_with_tests(self.sv.extra_path)
        env.pop(ENV_SOCKET, None)
        cmd = [sys.executable, "-m", "supervisor", *args]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)

    def reload_cmd(self, timeout: float = 60) -> list[str]:
        return ["reload", "--pidfile", self.sv.pidfile, "--wait", "--timeout", f"{timeout:g}"]

    def run_version(self) -> object:
        run_id = self.sv.enqueue("version")
        wait_for(lambda: self.sv.run_status(run_id) == "succeeded", what="the version run")
        store = open_store(self.sv.db)
        try:
            run = store.get_run(run_id)
            assert run is not None
            return run.result
        finally:
            store.close()

    def active_generations(self) -> set[int]:
        state = read_state(self.sv.pidfile)
        assert state is not None
        return {w["generation"] for w in state["workers"] if w["retiring"] is None}


@pytest.fixture
def listener(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Listener:
    path = tmp_path / "notify.sock"
    lst = Listener(str(path))
    monkeypatch.setenv(ENV_SOCKET, str(path))
    yield lst  # type: ignore[misc]
    lst.close()


def statuses_since(listener: Listener, key: str, since: float) -> list[str]:
    return [f.get("STATUS", "") for f in listener.with_key(key, since)]


def test_a_good_reload_waits_for_every_worker_and_ready(
    sv: Supervisor, tmp_path: Path, listener: Listener
) -> None:
    s = Setup(sv, tmp_path)
    s.write("v1")
    sv.start(n=2, app=f"{MODULE}:app")
    listener.wait("READY")
    s.write("v2-new")
    hup = time.monotonic()
    done = s.cli(*s.reload_cmd())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "reload 1 done: 2 workers on generation 1"
    # READY=1 was sent before the command returned: it is already in the socket's queue
    after = [k for t, f in listener.poll() if t >= hup for k in f if k in ("RELOADING", "READY")]
    assert after == ["RELOADING", "READY"], after
    assert listener.with_key("RELOADING", hup)[0]["MONOTONIC_USEC"].isdigit()
    assert s.active_generations() == {1}
    state = read_state(sv.pidfile)
    assert state is not None and state["reload"]["status"] == "done"
    assert s.run_version() == {"version": "v2-new"}
    # the new code ran in the probe and the new workers, never in the supervisor itself
    assert s.importers("v1") == [sv.pid]
    assert sv.pid not in s.importers("v2-new") and len(s.importers("v2-new")) >= 3


def test_a_slow_import_never_blocks_the_loop(
    sv: Supervisor, tmp_path: Path, listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_WATCHDOG_USEC, "400000")  # WatchdogSec=0.4: a ping every 0.2 s
    s = Setup(sv, tmp_path)
    release = tmp_path / "release"
    s.write("v1")
    sv.start(n=2, app=f"{MODULE}:app")
    listener.wait("READY")
    s.write("v2-new", slow_until(release))
    hup = time.monotonic()
    gave_up = s.cli(*s.reload_cmd(timeout=3))
    assert gave_up.returncode == exitcodes.ERROR
    assert gave_up.stderr.count("\n") == 1, gave_up.stderr
    assert "did not finish within 3s (still importing the new code); it goes on" in gave_up.stderr

    listener.wait("RELOADING", since=hup)
    reloading_at = next(t for t, f in listener.poll() if t >= hup and "RELOADING" in f)
    listener.wait("WATCHDOG", count=3, since=reloading_at)  # the loop turns during the import
    victim = sv.workers()[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(
        lambda: any(e["worker"] == victim for e in sv.events("worker_exited")),
        what="the killed worker reaped while the import runs",
    )
    sv.wait_workers(2)
    assert not release.exists()  # the import cannot have finished: RELOADING came first
    state = read_state(sv.pidfile)
    assert state is not None and state["reload"]["status"] == "importing"

    waiter = subprocess.Popen(
        [sys.executable, "-m", "supervisor", *s.reload_cmd()],
        env={k: v for k, v in env_with_tests(s.sv.extra_path).items() if k != ENV_SOCKET},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        sv.wait_event("reload_superseded")  # a second HUP starts over with a fresh probe
        release.touch()
        out, err = waiter.communicate(timeout=90)
    finally:
        waiter.kill()
    assert waiter.returncode == 0, err
    assert out.startswith("reload 2 done")
    assert s.active_generations() == {1}
    listener.wait("READY", since=reloading_at)
    # the first, killed probe was reaped: no zombie child left behind
    wait_for(
        lambda: all(c.status() != psutil.STATUS_ZOMBIE for c in psutil.Process(sv.pid).children()),
        what="no zombie children",
    )


def test_a_syntax_error_fails_the_reload_and_keeps_the_old_workers(
    sv: Supervisor, tmp_path: Path, listener: Listener
) -> None:
    s = Setup(sv, tmp_path)
    s.write("v1")
    sv.start(n=2, app=f"{MODULE}:app")
    listener.wait("READY")
    before = set(sv.workers())
    s.module.write_text("def broken(:\n")
    hup = time.monotonic()
    failed = s.cli(*s.reload_cmd())
    assert failed.returncode == exitcodes.RELOAD_FAILED
    (line,) = failed.stderr.splitlines()
    assert line.startswith(f"supervisor: error: reload 1 failed: cannot import '{MODULE}': ")
    assert "SyntaxError" in line and line.endswith("(the old workers keep serving)")
    (ready,) = statuses_since(listener, "READY", hup)  # systemd leaves "reloading"
    assert ready.startswith(f"reload failed: cannot import '{MODULE}': SyntaxError")

    status = s.cli("status", "--db", sv.db, "--pidfile", sv.pidfile)
    assert status.returncode == 0 and "reload 1 failed at" in status.stdout
    assert "SyntaxError" in status.stdout
    health = s.cli("health", "--pidfile", sv.pidfile)
    assert health.returncode == 0, health.stdout + health.stderr
    assert set(sv.workers()) == before
    assert s.run_version() == {"version": "v1"}

    s.write("v3-fixed")
    fixed = s.cli(*s.reload_cmd())
    assert fixed.returncode == 0, fixed.stderr
    assert not statuses_since(listener, "READY", hup)[-1].startswith("reload failed")
    status = s.cli("status", "--db", sv.db, "--pidfile", sv.pidfile)
    (reload_line,) = [ln for ln in status.stdout.splitlines() if ln.startswith("reload ")]
    assert reload_line.startswith("reload 2 done at ")
    assert s.run_version() == {"version": "v3-fixed"}


@pytest.mark.parametrize(
    ("how", "code"), [("os._exit(3)", 3), ("raise RuntimeError('no boot here')", 77)]
)
def test_new_workers_that_cannot_boot_fail_the_reload_not_the_pool(
    sv: Supervisor, tmp_path: Path, listener: Listener, how: str, code: int
) -> None:
    s = Setup(sv, tmp_path)
    s.write("v1")
    sv.start(n=2, app=f"{MODULE}:app")
    listener.wait("READY")
    before = set(sv.workers())
    s.write("v2-new", second_import_fails(s.imports, how))
    hup = time.monotonic()
    failed = s.cli(*s.reload_cmd())
    assert failed.returncode == exitcodes.RELOAD_FAILED, failed.stdout + failed.stderr
    (line,) = failed.stderr.splitlines()
    assert f"exited with code {code}" in line and "cannot boot on the new code" in line
    assert len(s.importers("v2-new")) == 2  # the probe passed; the first new worker failed
    (ready,) = statuses_since(listener, "READY", hup)
    assert ready.startswith("reload failed: worker ")
    assert sv.proc is not None and sv.proc.poll() is None  # a boot failure at start would stop
    assert s.cli("health", "--pidfile", sv.pidfile).returncode == 0
    assert set(sv.wait_workers(2)) == before and s.active_generations() == {0}
    assert s.run_version() == {"version": "v1"}
