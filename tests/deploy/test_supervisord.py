"""A real supervisord (Debian's ``supervisor`` package: /usr/bin/supervisord on the system Python,
outside our virtual environment, so its ``supervisor`` package never meets ours) runs the shipped
``deploy/supervisord/leasekeeper.conf`` program, with only paths and the app swapped for a temp
directory: ``supervisorctl signal HUP`` rolls the workers; ``supervisorctl stop`` drains them
(the running task finishes), exit status 0, no worker left, nothing leased."""

from __future__ import annotations

import configparser
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from deploy_files import SUPERVISORD_CONF
from helpers import wait_for
from sv_harness import SUPPORT, TESTS, gone, marker_lines
from tools import require_tool

from workerproc.store import open_store

pytestmark = pytest.mark.slow

SUPERVISORD = "/usr/bin/supervisord"
SUPERVISORCTL = "/usr/bin/supervisorctl"


def program_section(tmp: Path) -> dict[str, str]:
    """The shipped [program:leasekeeper], pointed at this checkout and a temp directory."""
    parser = configparser.RawConfigParser(comment_prefixes=(";", "#"), interpolation=None)
    parser.read(SUPERVISORD_CONF)
    prog = dict(parser["program:leasekeeper"])
    command = prog["command"]  # kept multi-line as shipped: supervisord must parse that form
    values = {"--db": str(tmp / "lk.db"), "--app": "apps.sv_app:app", "-n": "2",
              "--pidfile": str(tmp / "sv.pid")}  # fmt: skip
    for flag, new in values.items():
        command, found = re.subn(
            rf"(^|\s){flag}\s+\S+", rf"\g<1>{flag} {shlex.quote(new)}", command
        )
        assert found == 1, f"{flag} not in the shipped command"
    binary = shlex.split(command)[0]
    assert binary == "/opt/leasekeeper/bin/supervisor"
    prog["command"] = command.replace(binary, f"{sys.executable} -m supervisor", 1)
    assert "\n" in prog["command"]
    prog["directory"] = str(tmp)
    prog["stdout_logfile"] = str(tmp / "leasekeeper.log")
    prog["environment"] = f'PYTHONPATH="{TESTS}{os.pathsep}{SUPPORT}"'
    del prog["user"]  # the test runs as whoever runs it
    return prog


def write_config(tmp: Path) -> Path:
    conf = configparser.RawConfigParser(interpolation=None)
    conf["supervisord"] = {
        "nodaemon": "true",
        "logfile": str(tmp / "supervisord.log"),
        "pidfile": str(tmp / "supervisord.pid"),
        "childlogdir": str(tmp),
    }
    conf["unix_http_server"] = {"file": str(tmp / "ctl.sock")}
    conf["rpcinterface:supervisor"] = {
        "supervisor.rpcinterface_factory": "supervisor.rpcinterface:make_main_rpcinterface"
    }
    conf["supervisorctl"] = {"serverurl": f"unix://{tmp / 'ctl.sock'}"}
    conf["program:leasekeeper"] = program_section(tmp)
    path = tmp / "supervisord.conf"
    with path.open("w") as fh:
        conf.write(fh)
    return path


def system_env() -> dict[str, str]:
    """supervisord's environment: nothing that could put our ``supervisor`` package first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISOR_", "PYTHON"))}
    env.pop("NOTIFY_SOCKET", None)
    return env


class Supervisord:
    def __init__(self, tmp: Path) -> None:
        require_tool("supervisord", SUPERVISORD if os.path.exists(SUPERVISORD) else None,
                     "supervisor")  # fmt: skip
        self.tmp = tmp
        self.conf = write_config(tmp)
        self.proc = subprocess.Popen(
            [SUPERVISORD, "-c", str(self.conf)],
            cwd=tmp,
            env=system_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SUPERVISORCTL, "-c", str(self.conf), *args],
            env=system_env(),
            capture_output=True,
            text=True,
            timeout=90,
        )

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        with contextlib.suppress(OSError):
            for line in (self.tmp / "leasekeeper.log").read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    doc = json.loads(line)
                    if isinstance(doc, dict) and doc.get("event") == name:
                        found.append(doc)
        return found

    def wait_event(self, name: str, count: int = 1) -> list[dict[str, Any]]:
        return wait_for(
            lambda: e if len(e := self.events(name)) >= count else None,
            what=f"{count} x {name!r} in the program log:\n{self.logs()}",
        )

    def logs(self) -> str:
        parts = []
        for name in ("supervisord.log", "leasekeeper.log"):
            with contextlib.suppress(OSError):
                parts.append(f"--- {name}\n" + (self.tmp / name).read_text(errors="replace"))
        return "\n".join(parts)

    def workers(self, pid: int) -> set[int]:
        try:
            children = psutil.Process(pid).children()
        except psutil.NoSuchProcess:
            return set()
        return {c.pid for c in children if c.status() != psutil.STATUS_ZOMBIE}

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


@pytest.fixture
def supervisord(tmp_path: Path) -> Iterator[Supervisord]:
    sd = Supervisord(tmp_path)
    try:
        yield sd
    finally:
        sd.close()


def test_supervisorctl_hup_rolls_and_stop_drains(supervisord: Supervisord, tmp_path: Path) -> None:
    sd = supervisord
    (started,) = sd.wait_event("supervisor_started")
    pid = int(started["pid"])
    assert psutil.Process(pid).ppid() == sd.proc.pid  # supervisord runs our supervisor directly
    sd.wait_event("ready")
    first = wait_for(lambda: w if len(w := sd.workers(pid)) == 2 else None, what="2 workers")

    hup = sd.ctl("signal", "HUP", "leasekeeper")
    assert hup.returncode == 0, hup.stdout + hup.stderr
    sd.wait_event("reloaded")
    rolled = wait_for(lambda: w if len(w := sd.workers(pid)) == 2 else None, what="2 new workers")
    assert rolled.isdisjoint(first) and gone(list(first))
    assert psutil.pid_exists(pid)  # the same supervisor: a roll, not a restart

    marker = tmp_path / "m"
    store = open_store(str(tmp_path / "lk.db"))
    try:
        run = store.start_run("hold", {"marker": str(marker), "s": 1.0})
    finally:
        store.close()
    wait_for(lambda: marker_lines(marker), what="a worker to hold the task")
    workers = sd.workers(pid)

    stop = sd.ctl("stop", "leasekeeper")
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "stopped" in stop.stdout
    assert gone([pid, *workers])
    store = open_store(str(tmp_path / "lk.db"))
    try:
        assert store.get_run(run).status == "succeeded"  # type: ignore[union-attr]
        assert store.stats().leased == 0
    finally:
        store.close()
    (stopped,) = sd.events("supervisor_stopped")
    assert stopped["code"] == 0
    wait_for(
        lambda: "stopped: leasekeeper (exit status 0)" in sd.logs(),
        what="supervisord to record exit status 0",
    )
    status = sd.ctl("status", "leasekeeper")
    assert "STOPPED" in status.stdout  # not restarted: a requested stop is not a failure
