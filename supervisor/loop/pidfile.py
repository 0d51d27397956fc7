"""The pidfile: a filelock decides who runs; the pid lives in its own file for other tools.

- ``FILE.lock`` is taken with filelock (an ``flock``, opened with ``O_NOFOLLOW``, mode 0600): the
  kernel drops it when the supervisor dies, so a stale ``FILE`` left by a SIGKILL never blocks the
  next start, and a second supervisor on the same pidfile refuses at once.
- ``FILE`` holds only the pid (what systemd's ``PIDFile=`` and shell scripts expect), mode 0644.
  Readers refuse it unless it is a regular file owned by them (or root) that nobody else can
  write, and check it with psutil: the process must exist and have started no later than the
  file was written, so a pid reused by an unrelated process is never signalled. Before a signal,
  the process must also be a leasekeeper supervisor (its command line, its start time).
- ``FILE.state`` is JSON the running loop rewrites about once a second (workers, target size,
  last tick), mode 0644: ``status``, ``scale`` and ``health`` read it. It is written first at
  ``acquire`` (phase ``starting``). When a rewrite fails (a full disk), the loop logs it once
  and touches the old file instead, so ``health`` can tell "cannot write its state" from "the
  loop is silent".
- Every write is atomic through a random temporary name (``supervisor.files.write_atomic``).
- Workers do not keep the lock: the forked child closes its copy of the lock descriptor (filelock 4
  already does so at fork; ``close_in_child`` covers older versions), so a worker that outlives a
  killed supervisor can never block a restart.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import time
from typing import Any

from ..errors import NotRunning, PidfileLocked, SupervisorError
from ..files import PRIVATE, PUBLIC, UntrustedFile, read_trusted, write_atomic
from ..logs import event


def state_path(pidfile: str) -> str:
    return pidfile + ".state"


class Pidfile:
    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        import filelock  # noqa: PLC0415 - a pool without --pidfile does not load it

        self._lock = filelock.FileLock(self.path + ".lock", timeout=0, mode=PRIVATE)
        self._fd_identity: tuple[int, int, int] | None = None
        import psutil  # noqa: PLC0415 - at first use: show and enqueue only read the state

        self._started = round(psutil.Process().create_time(), 2)
        self.state_error: str | None = None  # the last failed state write, until one succeeds

    def acquire(self) -> None:
        import filelock  # noqa: PLC0415 - (loaded by __init__)

        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            raise SupervisorError(f"pidfile directory {directory} does not exist")
        try:
            self._lock_current()
        except filelock.Timeout:
            try:
                holder = read_pid(self.path)
            except SupervisorError:
                holder = None
            who = f"pid {holder}" if holder else "another process"
            raise PidfileLocked(
                f"another supervisor ({who}) holds {self.path}; stop it or use another --pidfile"
            ) from None
        except OSError as exc:
            raise SupervisorError(f"cannot lock {self.path}.lock: {exc.strerror}") from None
        self._fd_identity = _find_fd(self.path + ".lock")
        try:
            write_atomic(self.path, f"{os.getpid()}\n", PUBLIC)
            write_atomic(state_path(self.path), self._state_text({"phase": "starting"}), PUBLIC)
        except OSError as exc:
            self._lock.release()
            raise SupervisorError(f"cannot write the pidfile {self.path}: {exc.strerror}") from None

    def _lock_current(self) -> None:
        """Lock ``FILE.lock``, and be sure the lock is on the file that path names now: a
        supervisor that stops removes the file before it unlocks it (nothing is left behind),
        so a lock taken on a file opened just before that removal locks nothing anyone else
        sees; then the path's new file is locked instead (or found held)."""
        for _ in range(3):
            self._lock.acquire()
            if _same_file(self.path + ".lock", _find_fd(self.path + ".lock")):
                return
            self._lock.release()
        import filelock  # noqa: PLC0415 - (loaded by __init__)

        raise filelock.Timeout(self.path + ".lock")

    def _state_text(self, state: dict[str, Any]) -> str:
        doc = {"pid": os.getpid(), "tick": round(time.time(), 3), **state}
        doc["started"] = self._started  # lets readers check the pid's start time
        return json.dumps(doc, separators=(",", ":"))

    def write_state(self, state: dict[str, Any]) -> bool:
        """Rewrite the state file; False when that failed (a full disk must not stop the
        supervisor). The first failure and the recovery are logged once each."""
        path = state_path(self.path)
        try:
            write_atomic(path, self._state_text(state), PUBLIC)
        except OSError as exc:
            with contextlib.suppress(OSError):  # the loop runs: say so through the mtime
                os.utime(path, follow_symlinks=False)
            if self.state_error is None:
                event(
                    "state_write_failed",
                    f"cannot write the state file {path} ({exc.strerror or exc}): status, scale "
                    "and health see old data until it can be written again",
                    level=logging.WARNING,
                    error=str(exc.strerror or exc),
                )
            self.state_error = str(exc.strerror or exc)
            return False
        if self.state_error is not None:
            event("state_write_recovered", f"the state file {path} is written again")
            self.state_error = None
        return True

    def release(self) -> None:
        try:
            ours = read_pid(self.path) == os.getpid()
        except SupervisorError:
            ours = False  # someone replaced it: not ours to remove
        if ours:
            for path in (self.path, state_path(self.path)):
                with contextlib.suppress(OSError):
                    os.remove(path)
        lock = self.path + ".lock"
        if self._lock.is_locked and _same_file(lock, self._fd_identity):
            with contextlib.suppress(OSError):  # removed while still locked (see _lock_current)
                os.remove(lock)
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


def _same_file(path: str, identity: tuple[int, int, int] | None) -> bool:
    """``path`` names the file our descriptor ``identity`` (fd, dev, inode) has open."""
    if identity is None:
        return False
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == identity[1:]


def read_pid(path: str) -> int | None:
    """The pid in ``path`` (None: missing or not a pid); UntrustedFile if we must not believe it."""
    try:
        text = read_trusted(path, "pidfile")
    except OSError:
        return None
    text = (text or "").strip()
    # ASCII digits only: str.isdigit() takes "²", which int() refuses
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 10 else None


def live_pid(path: str) -> int:
    """The pid of the supervisor behind ``path``, checked; raise NotRunning otherwise."""
    pid = read_pid(path)
    if pid is None:
        raise NotRunning(f"no supervisor is running: no pid in {path}")
    import psutil  # noqa: PLC0415 - at first use (Pidfile)

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


def is_supervisor_command(argv: list[str]) -> bool:
    """``supervisor start …`` or ``python -m supervisor start …`` (any path to either)."""
    for i, arg in enumerate(argv):
        if os.path.basename(arg) == "supervisor" and "start" in argv[i + 1 :]:
            return True
    return False


def supervisor_pid(path: str) -> int:
    """``live_pid``, and the process really is the leasekeeper supervisor that wrote ``path``:
    its command line is ``supervisor start`` and its start time is the one in the state file.
    Only such a pid is ever signalled."""
    pid = live_pid(path)
    import psutil  # noqa: PLC0415 - at first use (Pidfile)

    try:
        proc = psutil.Process(pid)
        argv = proc.cmdline()
        started = round(proc.create_time(), 2)
    except psutil.NoSuchProcess:
        raise NotRunning(f"no supervisor is running: pid {pid} exited") from None
    except psutil.Error as exc:
        msg = f"refusing to signal pid {pid} from {path}: cannot check it ({exc})"
        raise UntrustedFile(msg) from None
    if not is_supervisor_command(argv):
        shown = shlex.join(argv)[:120] or "?"
        raise UntrustedFile(
            f"refusing to signal pid {pid} from {path}: it is not a leasekeeper supervisor "
            f"(its command line is {shown!r})"
        )
    state = read_state(path)
    recorded = state.get("started") if state is not None and state.get("pid") == pid else None
    if isinstance(recorded, (int, float)) and abs(float(recorded) - started) > 0.015:
        raise UntrustedFile(
            f"refusing to signal pid {pid} from {path}: it started at {started}, not at "
            f"{recorded} as the supervisor that wrote the state file did"
        )
    return pid


def read_state(path: str) -> dict[str, Any] | None:
    try:
        text = read_trusted(state_path(path), "state file")
    except OSError:
        return None
    try:
        value = json.loads(text or "")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def state_age(state: dict[str, Any]) -> float:
    return time.time() - float(state.get("tick", 0.0))


def state_touched_age(path: str) -> float | None:
    """Seconds since the state file was last written or touched (None: it is missing)."""
    try:
        return time.time() - os.stat(state_path(path), follow_symlinks=False).st_mtime
    except OSError:
        return None
