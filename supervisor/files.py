"""Files the supervisor writes or trusts: explicit modes, no symlink followed, no predictable
temporary name, and nothing read from a file another user could have written.

Every file the supervisor writes (pidfile, its state file, the chaos report) goes through
``write_atomic``: a temporary file made by ``mkstemp`` in the target directory (``O_EXCL |
O_NOFOLLOW``, a random name, mode 0600), set to its final mode with ``fchmod`` (the umask plays no
part), then renamed over the target. A rename replaces a symlink planted at the target name; it
never writes through it.

``read_trusted`` opens with ``O_NOFOLLOW`` and refuses a file that is not a regular file, is
owned by someone other than us or root, or is writable by group or others: a pid read from such a
file could have been planted to make us signal another process.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from .errors import SupervisorError

PUBLIC = 0o644  # others may read (the pidfile for systemd and monitors, status, reports)
PRIVATE = 0o600


class UntrustedFile(SupervisorError):
    """A pidfile or state file we refuse to believe (symlink, foreign owner, writable by others)."""


def write_atomic(path: str, text: str, mode: int = PUBLIC) -> None:
    """Replace ``path`` with ``text`` atomically, with exactly ``mode``."""
    import tempfile  # noqa: PLC0415 - (with shutil, bz2, lzma: not in a pool that writes no file)

    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_trusted(path: str, what: str) -> str | None:
    """The text of ``path``; None when it does not exist. Raise UntrustedFile when it is a
    symlink, not a regular file, owned by another user (root excepted) or writable by others."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedFile(f"refusing {what} {path}: it is a symbolic link") from None
        raise
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as fh:
        st = os.fstat(fh.fileno())
        problem = _untrusted(st)
        if problem:
            raise UntrustedFile(f"refusing {what} {path}: {problem}")
        return fh.read(65536)


def _untrusted(st: os.stat_result) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        return (
            f"owned by uid {st.st_uid}, not by you (uid {me}) or root; run the command as the "
            "user that runs the supervisor"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None
