"""A real ``supervisor web`` process for tests: started in its own session, its URL read from
the line it prints, stopped with TERM (and killed with its session at teardown)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import wait_for
from sv_harness import env_with_tests


class WebProcess:
    def __init__(self, workdir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.out = workdir / "web.out"
        self.err = workdir / "web.err"
        cmd = [sys.executable, "-m", "supervisor", "web", *args]
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=err, cwd=workdir, start_new_session=True,
                env={**env_with_tests(), **(env or {})},
            )  # fmt: skip

    def url(self, timeout: float = 30.0) -> str:
        def printed() -> str | None:
            found = re.search(r"dashboard on (http://\S+/)", self.out.read_text())
            if found is None and self.proc.poll() is not None:
                raise AssertionError(f"supervisor web exited {self.proc.returncode}: "
                                     f"{self.err.read_text()}")  # fmt: skip
            return found.group(1) if found else None

        return wait_for(printed, timeout=timeout, what="the dashboard's URL")

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        request = urllib.request.Request(self.url() + path.lstrip("/"), headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def stderr(self) -> str:
        return self.err.read_text()


@pytest.fixture
def web_procs() -> Iterator[list[WebProcess]]:
    """Dashboards a test starts (``web_procs.append(WebProcess(...))``), killed after it."""
    started: list[WebProcess] = []
    yield started
    for proc in started:
        proc.kill()
