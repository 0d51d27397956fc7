"""Run the real supervisor for process-level tests: its own session, JSON logs in a file,
teardown with killpg. Waits are on state (log events, the database), never fixed sleeps."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
from helpers import wait_for

from workerproc.store import Stats, open_store

SUPPORT = Path(__file__).resolve().parent  # these modules and the support scripts
TESTS = SUPPORT.parent  # the apps package the workers import
APP = "apps.sv_app:app"


def env_with_tests(extra_path: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    parts = [str(TESTS), str(SUPPORT)] + ([extra_path] if extra_path else [])
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    for key in [k for k in env if k.startswith("SUPERVISOR_")]:
        del env[key]
    env.pop("JOURNAL_STREAM", None)
    return env


class Supervisor:
    """One ``python -m supervisor start`` process and what it wrote."""

    def __init__(self, workdir: Path, name: str = "sv") -> None:
        self.workdir = workdir
        self.db = str(workdir / "lk.db")
        self.pidfile = str(workdir / f"{name}.pid")
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra_path: str | None = None
        self.command = [sys.executable, "-m", "supervisor"]  # a test may run a wrapper instead

    # -- process ---------------------------------------------------------------------------
    def start(self, *args: str, n: int = 2, app: str = APP, pidfile: bool = True) -> Supervisor:
        cmd = [*self.command, "start", "-n", str(n), "--db", self.db]
        cmd += ["--app", app, "--log-format", "json", *args]
        if pidfile:
            cmd += ["--pidfile", self.pidfile]
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=log,
                cwd=self.workdir,
                env=env_with_tests(self.extra_path),
                start_new_session=True,
            )
        finally:
            log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def wait_exit(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            msg = f"supervisor still running after {timeout}s:\n{self.text()}"
            raise AssertionError(msg) from None

    def kill_all(self) -> None:
        """Teardown: SIGKILL the whole session (supervisor and any worker)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    # -- what it says ----------------------------------------------------------------------
    def text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        found = []
        for line in self.text().splitlines():
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict) and (name is None or doc.get("event") == name):
                    found.append(doc)
        return found

    def wait_event(self, name: str, count: int = 1, timeout: float = 30.0) -> list[dict[str, Any]]:
        def seen() -> list[dict[str, Any]] | None:
            exited = self.proc is not None and self.proc.poll() is not None
            if exited and not self._has(name, count):
                assert self.proc is not None
                raise AssertionError(
                    f"supervisor exited ({self.proc.returncode}) before {name!r}:\n{self.text()}"
                )
            found = self.events(name)
            return found if len(found) >= count else None

        return wait_for(seen, timeout=timeout, what=f"{count} x {name!r} event")

    def _has(self, name: str, count: int) -> bool:
        return len(self.events(name)) >= count

    def workers(self) -> list[int]:
        """Live, non-zombie worker pids (children of the supervisor)."""
        try:
            children = psutil.Process(self.pid).children()
        except psutil.NoSuchProcess:
            return []
        alive = []
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                if child.status() != psutil.STATUS_ZOMBIE:
                    alive.append(child.pid)
        return alive

    def wait_workers(self, n: int, timeout: float = 30.0) -> list[int]:
        return wait_for(
            lambda: pids if len(pids := self.workers()) == n else None,
            timeout=timeout,
            what=f"{n} workers",
        )

    # -- the database ----------------------------------------------------------------------
    def enqueue(self, task: str, payload: Any = None, state: Any = None) -> int:
        store = open_store(self.db)
        try:
            return store.start_run(task, payload, state=state)
        finally:
            store.close()

    def stats(self) -> Stats:
        store = open_store(self.db)
        try:
            return store.stats()
        finally:
            store.close()

    def run_status(self, run_id: int) -> str:
        store = open_store(self.db)
        try:
            run = store.get_run(run_id)
            assert run is not None
            return run.status
        finally:
            store.close()


def marker_lines(path: Path) -> list[tuple[int, int]]:
    """(pid, attempt) lines written by the ``hold`` task."""
    try:
        text = path.read_text()
    except OSError:
        return []
    return [(int(a), int(b)) for a, b in (line.split() for line in text.splitlines() if line)]


def gone(pids: list[int]) -> bool:
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
    return True
