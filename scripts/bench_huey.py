"""huey's side of scripts/bench: a SqliteHuey app whose tasks report to the benchmark over a Unix
datagram socket (huey deletes a task when it dequeues it, so its database cannot tell when a task
finished; a datagram costs the task a few microseconds)."""

from __future__ import annotations

import os
import socket
import time

from huey import SqliteHuey

huey = SqliteHuey(filename=os.environ.get("LK_HUEY_DB", "huey.db"))  # default: synchronous FULL
_sock: socket.socket | None = None


def _send(message: bytes) -> None:
    global _sock
    if _sock is None:
        _sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    _sock.sendto(message, os.environ["LK_HUEY_SOCK"])


@huey.task()
def noop() -> None:
    _send(b".")


@huey.task()
def stamp() -> None:
    _send(repr(time.time()).encode())


@huey.task()
def hold(seconds: float) -> None:
    _send(b"start %d" % os.getpid())
    time.sleep(seconds)
    _send(b"done")


@huey.task()
def io(seconds: float) -> None:
    """An I/O-bound call (as benchapp's io_sync): run it on thread workers."""
    time.sleep(seconds)
    _send(b".")
