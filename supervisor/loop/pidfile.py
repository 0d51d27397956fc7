"""The pidfile: a filelock decides who runs; the pid lives in its own file for other tools.

- ``FILE.lock`` is taken with filelock (an ``flock``): the kernel drops it when the supervisor dies,
  so a stale ``FILE`` left by a SIGKILL never blocks the next start, and a second supervisor on the
  same pidfile refuses at once.
- ``FILE`` holds only the pid (what systemd's ``PIDFile=`` and shell scripts expect). Readers check
  it with psutil: the process must exist and have started no later than the file was written, so
  a pid reused by an unrelated process is never signalled.
- ``FILE.state`` is JSON the running loop rewrites about once a second (workers, target size,
  last tick): ``status``, ``scale`` and ``health`` read it.
- Workers do not keep the lock: the forked child closes its copy of the lock descriptor (filelock 4
  already does so at fork; ``close_in_child`` covers older versions), so a worker that outlives a
  killed supervisor can never block a restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

import filelock
import psutil

from ..errors import NotRunning, PidfileLocked, SupervisorError


def state_path(pidfile: str) -> str:
    return pidfile + ".state"


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


class Pidfile:
    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self._lock = filelock.FileLock(self.path + ".lock", timeout=0)
        self._fd_identity: tuple[int, int, int] | None = None

    def acquire(self) -> None:
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            raise SupervisorError(f"pidfile directory {directory} does not exist")
        try:
            self._lock.acquire()
        except filelock.Timeout:
            holder = read_pid(self.path)
            who = f"pid {holder}" if holder else "another process"
            raise PidfileLocked(
                f"another supervisor ({who}) holds {self.path}; stop it or use another --pidfile"
            ) from None
        except OSError as exc:
            raise SupervisorError(f"cannot lock {self.path}.lock: {exc.strerror}") from None
        self._fd_identity = _find_fd(self.path + ".lock")
        _write_atomic(self.path, f"{os.getpid()}\n")

    def write_state(self, state: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # a full disk must not stop the supervisor
            _write_atomic(state_path(self.path), json.dumps(state, separators=(",", ":")))

    def release(self) -> None:
        if read_pid(self.path) == os.getpid():
            for path in (self.path, state_path(self.path)):
                with contextlib.suppress(OSError):
                    os.remove(path)
        with contextlib.suppress(Exception):
            self._lock.release()

    def close_in_child(self) -> None:
        """In a forked worker: close the inherited lock descriptor if it is still open here."""
        if self._fd_identity is None:
            return
        fd, dev, ino = self._fd_identity
        try:
            st = os.fstat(fd)
        except OSError:
            return  # filelock closed it already
        if (st.st_dev, st.st_ino) == (dev, ino):
            with contextlib.suppress(OSError):
                os.close(fd)


def _find_fd(path: str) -> tuple[int, int, int] | None:
    """This process's descriptor on ``path`` (the lock), found without filelock internals."""
    try:
        target = os.stat(path)
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for entry in names:
        fd = int(entry)
        with contextlib.suppress(OSError):
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                return (fd, st.st_dev, st.st_ino)
    return None


def read_pid(path: str) -> int | None:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def live_pid(path: str) -> int:
    """The pid of the supervisor behind ``path``, checked; raise NotRunning otherwise."""
    pid = read_pid(path)
    if pid is None:
        raise NotRunning(f"no supervisor is running: no pid in {path}")
    try:
        written = os.stat(path).st_mtime
        proc = psutil.Process(pid)
        alive = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        started = proc.create_time()
    except (OSError, psutil.Error):
        alive, started, written = False, 0.0, 0.0
    if not alive:
        raise NotRunning(f"no supervisor is running: pid {pid} from {path} is gone (stale file)")
    if started > written + 1.0:
        raise NotRunning(f"no supervisor is running: pid {pid} was reused by another process")
    return pid


def read_state(path: str) -> dict[str, Any] | None:
    try:
        with open(state_path(path), encoding="utf-8") as fh:
            value = json.load(fh)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def state_age(state: dict[str, Any]) -> float:
    return time.time() - float(state.get("tick", 0.0))
