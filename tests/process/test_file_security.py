"""Files an attacker can reach. Every file we write has an explicit mode whatever
the umask, no symlink planted at one of our names is ever written through, a pidfile another
user could have written is refused, and ``stop`` signals only a verified leasekeeper
supervisor."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runner import error_line, invoke
from helpers import wait_for
from sv_harness import Supervisor, env_with_tests

from supervisor import exitcodes
from supervisor.files import UntrustedFile
from supervisor.loop.pidfile import Pidfile, live_pid, read_state, state_path

VICTIM_TEXT = "precious data of another file\n"


def mode(path: str | Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """An innocent process (think: a root daemon) whose pid someone writes into a pidfile."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


# -- explicit modes ---------------------------------------------------------------------------
def test_pidfile_state_and_lock_have_explicit_modes_under_umask_000(
    tmp_path: Path, umask_000: None
) -> None:
    path = str(tmp_path / "s.pid")
    pidfile = Pidfile(path)
    pidfile.acquire()
    try:
        assert pidfile.write_state({"phase": "running", "target": 1})
        assert mode(path) == 0o644  # systemd and monitors read it
        assert mode(state_path(path)) == 0o644
        assert mode(path + ".lock") == 0o600
        assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # no leftovers
    finally:
        pidfile.release()


def test_the_chaos_report_has_an_explicit_mode_under_umask_000(tmp_path: Path) -> None:
    sv = Supervisor(tmp_path)
    report = tmp_path / "chaos.json"
    cmd = [sys.executable, "-m", "supervisor", "start", "-n", "1", "--db", sv.db, "--app",
           "apps.sv_app:app", "--drain", "--chaos", "--chaos-report", str(report)]  # fmt: skip
    done = subprocess.run(cmd, env=env_with_tests(), umask=0, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(report.read_text())["ok"] is True
    assert mode(report) == 0o644


# -- symlinks planted at our names ------------------------------------------------------------
def test_a_symlink_at_the_old_temporary_state_name_is_never_written_through(
    sv: Supervisor,
) -> None:
    victim = sv.workdir / "victim"
    victim.write_text(VICTIM_TEXT)
    sv.start(n=1)
    sv.wait_event("ready")
    state = wait_for(lambda: read_state(sv.pidfile), what="the state file")
    # the name the state file used to be written through: predictable from the pid
    os.symlink(victim, f"{state_path(sv.pidfile)}.{sv.pid}.tmp")
    first = state["tick"]
    wait_for(
        lambda: (s := read_state(sv.pidfile)) and s["tick"] >= first + 2,
        what="two more state writes",
    )
    assert victim.read_text() == VICTIM_TEXT
    assert not os.path.islink(state_path(sv.pidfile))


def test_a_symlink_at_the_pidfile_is_replaced_and_at_the_lock_refused(sv: Supervisor) -> None:
    victim = sv.workdir / "victim"
    victim.write_text(VICTIM_TEXT)
    os.symlink(victim, sv.pidfile)
    sv.start(n=1)
    sv.wait_event("ready")
    assert victim.read_text() == VICTIM_TEXT
    assert not os.path.islink(sv.pidfile) and live_pid(sv.pidfile) == sv.pid
    assert mode(sv.pidfile) == 0o644

    other = Supervisor(sv.workdir, name="other")
    os.symlink(victim, other.pidfile + ".lock")
    other.start(n=1)
    assert other.wait_exit() == exitcodes.ERROR
    assert victim.read_text() == VICTIM_TEXT
    assert "cannot lock" in other.text()


# -- pidfiles we must not believe --------------------------------------------------------------
def test_a_pidfile_writable_by_others_or_owned_by_another_user_is_refused(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "s.pid"
    pidfile.write_text(f"{os.getpid()}\n")
    assert live_pid(str(pidfile)) == os.getpid()
    os.chmod(pidfile, 0o666)
    with pytest.raises(UntrustedFile, match="writable by others"):
        live_pid(str(pidfile))
    os.chmod(pidfile, 0o644)
    if os.geteuid() == 0:  # only root can give a file away
        os.chown(pidfile, 54321, -1)
        with pytest.raises(UntrustedFile, match="owned by uid 54321"):
            live_pid(str(pidfile))
        line = error_line(invoke("health", "--pidfile", str(pidfile)), exitcodes.ERROR)
        assert "owned by uid 54321" in line
        os.chown(pidfile, os.geteuid(), -1)
    real = tmp_path / "real.pid"
    os.replace(pidfile, real)
    os.symlink(real, pidfile)
    with pytest.raises(UntrustedFile, match="symbolic link"):
        live_pid(str(pidfile))


def test_stop_never_signals_a_process_that_is_not_a_supervisor(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    pidfile = tmp_path / "s.pid"
    pidfile.write_text(f"{sleeper.pid}\n")  # written after the victim started: looks live
    for args in (["stop"], ["stop", "--fast"], ["reload"], ["scale", "+1"]):
        if args[0] == "scale":
            state = {"pid": sleeper.pid, "tick": time.time(), "phase": "running", "target": 1}
            Path(state_path(str(pidfile))).write_text(json.dumps(state))
        line = error_line(invoke(*args, "--pidfile", str(pidfile)), exitcodes.ERROR)
        assert "not a leasekeeper supervisor" in line
    time.sleep(0.2)  # a signal, had one been sent, would have landed by now
    assert sleeper.poll() is None


def test_stop_checks_the_start_time_the_supervisor_recorded(tmp_path: Path) -> None:
    """A process whose command line looks like ours but is not the one that wrote the state."""
    impostor = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "supervisor", "start"]
    )
    try:
        pidfile = tmp_path / "s.pid"
        pidfile.write_text(f"{impostor.pid}\n")
        state = {"pid": impostor.pid, "tick": time.time(), "phase": "running", "started": 12.5}
        Path(state_path(str(pidfile))).write_text(json.dumps(state))
        line = error_line(invoke("stop", "--pidfile", str(pidfile)), exitcodes.ERROR)
        assert "started at" in line
        time.sleep(0.2)
        assert impostor.poll() is None
    finally:
        impostor.kill()
        impostor.wait()
