"""Real worker processes for tests: spawned in their own session, torn down with killpg."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]  # tests/: the apps package the workers import


class Proc:
    def __init__(self, popen: subprocess.Popen[bytes], log: Path) -> None:
        self.popen = popen
        self.log = log

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)

    def wait(self, timeout: float = 30.0) -> int:
        return self.popen.wait(timeout)

    def kill(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)


def spawn_worker(
    db: str, workdir: Path, *args: str, name: str = "worker", env: dict[str, str] | None = None
) -> Proc:
    log = workdir / f"{name}-{len(list(workdir.glob(name + '-*.log')))}.log"
    env = {**os.environ, "LK_TEST_DIR": str(workdir), "PYTHONUNBUFFERED": "1", **(env or {})}
    cmd = [sys.executable, "-m", "workerproc", "--db", db, "--app", "apps.basic:app", *args]
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            cmd, cwd=TESTS, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Proc(popen, log)


def events(workdir: Path) -> list[list[str]]:
    path = workdir / "events.log"
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines() if line.strip()]
