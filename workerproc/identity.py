"""Worker identity: an owner string unique per process lifetime.

``host:pid:start:suffix`` — the process start time tells a reused pid apart, and the random
suffix (chosen by the parent before fork, so parent and child agree) tells apart two claims
loops in one process. The supervisor parses owners to release leases of dead processes.
"""

from __future__ import annotations

import os
import socket
from typing import NamedTuple


class OwnerId(NamedTuple):
    host: str
    pid: int
    start_time: str
    suffix: str


def process_start(pid: int) -> str:
    import psutil  # noqa: PLC0415 - at first use: a one-run command that only parses owners

    return f"{psutil.Process(pid).create_time():.2f}"


def make_owner(*, pid: int | None = None, suffix: str | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    suffix = os.urandom(4).hex() if suffix is None else suffix  # secrets.token_hex's source
    return f"{socket.gethostname()}:{pid}:{process_start(pid)}:{suffix}"


def parse_owner(owner: str) -> OwnerId | None:
    parts = owner.rsplit(":", 3)
    # ASCII digits only: str.isdigit() takes "²", which int() refuses (any caller names its
    # lease's owner, and the reaper, status and the dashboard all read it)
    if len(parts) != 4 or not (parts[1].isascii() and parts[1].isdigit()):
        return None
    return OwnerId(parts[0], int(parts[1]), parts[2], parts[3])


def owner_is_dead(owner: str) -> bool:
    """True when ``owner`` names a process on this host that no longer exists, whose pid was
    reused by another process, or that is a zombie: a process that exited and waits to be
    reaped (right after ``kill -9`` of a supervisor its workers are zombies until PID 1 reaps
    them, and psutil still reads their start time). Owners of other hosts are never judged dead
    from here."""
    parsed = parse_owner(owner)
    if parsed is None or parsed.host != socket.gethostname():
        return False
    import psutil  # noqa: PLC0415 - at first use (process_start)

    try:
        proc = psutil.Process(parsed.pid)
        if f"{proc.create_time():.2f}" != parsed.start_time:
            return True
        return proc.status() == psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return True
    except psutil.AccessDenied:
        return False
