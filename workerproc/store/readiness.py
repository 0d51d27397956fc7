"""Sleeping until a descriptor is ready, whatever its number: the sleeps of the worker and the
supervisor on their self-pipes, the store's change watch and its LISTEN socket.

``select.select`` refuses a descriptor numbered 1024 (``FD_SETSIZE``) or more ("filedescriptor
out of range in select()"), and a process gets such numbers: a worker with many slots, each
with its sockets, pipes and connections, or an app that keeps many files open. ``poll`` has no
such bound. A wait makes its own ``poll`` object (no kept one: one object refuses two threads
polling it at once, and a wait with nothing ready costs about a microsecond either way, a few
tenths of a microsecond more than ``select`` on two pipes).

As ``select`` did for its callers: the timeout is in seconds (kept to the millisecond, rounded
up: never shorter; a negative one: no wait; past ``poll``'s range, about 24 days, a wake-up at
its end with nothing ready); readable is what ``select`` counts as readable (data, end of file,
a hang-up, an error); a descriptor that is not open raises ``OSError`` (EBADF), a negative one
``ValueError``; a signal's EINTR is retried with what is left of the timeout (PEP 475) after its
Python handler ran, unless that handler raised. A signal wakes a wait through the self-pipe its
C-level handler writes (``signal.set_wakeup_fd``), which the wait watches.

Here, in the store, because the store imports nothing of the worker outside itself.
"""

from __future__ import annotations

import errno
import os
import select
from collections.abc import Iterable

_LONGEST_MS = 2**31 - 1  # poll's timeout is a C int of milliseconds
# (bound once: the worker's conductor waits often, and each lookup of ``select.X`` costs)
_poll, _IN, _OUT, _NVAL = select.poll, select.POLLIN, select.POLLOUT, select.POLLNVAL


def readable(fds: Iterable[int], timeout: float) -> bool:
    """Sleep until one of ``fds`` is readable or ``timeout`` seconds pass; whether one is."""
    poller = _poll()
    for fd in fds:
        poller.register(fd, _IN)
    return _polled(poller, timeout)


def writable(fd: int, timeout: float) -> bool:
    """Sleep until ``fd`` is writable (or in error, or hung up) or ``timeout`` seconds pass;
    whether it is."""
    poller = _poll()
    poller.register(fd, _OUT)
    return _polled(poller, timeout)


def _polled(poller: select.poll, timeout: float) -> bool:
    ms = timeout * 1000.0  # (poll rounds a fraction of a millisecond up: never short)
    if ms > _LONGEST_MS:
        ms = _LONGEST_MS
    elif ms < 0:  # (poll's negative is forever; NaN is refused, as by select)
        ms = 0
    ready = poller.poll(ms)
    if not ready:
        return False
    for _, revents in ready:
        if revents & _NVAL:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
    return True
