"""Signal handling for the supervisor: handlers only record; the main loop acts.

A signal that asks for an action (TERM, INT, QUIT, HUP, TTIN, TTOU) is appended to a list that
nothing bounds, in arrival order: three TTINs are three entries, and no burst of anything can
push a pending TERM out. SIGCHLD only sets a flag (the reap step runs on every turn anyway), so a
flood of child exits grows nothing. ``signal.set_wakeup_fd`` makes the C-level handler also
write a byte to a self-pipe, so a loop sleeping on it (``poll``) wakes at once.
Handlers are installed before the first fork, so a TERM that arrives during start-up waits in
the inbox instead of being lost. Around ``fork()`` the parent blocks these signals
(``blocked()``): the child unblocks them only after ``run_worker`` installed its own handlers,
so a TERM in that window never runs the parent's handler inside the child.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from types import FrameType

from workerproc.store.readiness import readable

# What the supervisor acts on: never dropped, never merged.
ACTIONS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGHUP,
    signal.SIGTTIN,
    signal.SIGTTOU,
)
# SIGCHLD only wakes the loop to reap.
HANDLED = (*ACTIONS, signal.SIGCHLD)
# Blocked across fork(): every signal the parent handles, so none runs a parent handler in a child.
BLOCKED_ACROSS_FORK = frozenset(HANDLED)


def name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class SignalInbox:
    """Records signals as they arrive; the loop drains them with ``wait()`` and ``pop_all()``."""

    def __init__(self) -> None:
        # Action signals in arrival order. Only ``record`` appends (one atomic list.append) and
        # only ``pop_all`` takes the list away (by swapping in a new one), so neither can lose
        # what the other did, even when a handler runs between two bytecodes of the loop.
        self.queue: list[int] = []
        self.child_exited = False  # SIGCHLD since the last pop_all: a flag, never a queue
        self._read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._previous: dict[int, object] = {}
        self._old_wakeup_fd: int | None = None
        self.extra_fds: set[int] = set()  # also wake the loop (the metrics endpoint's sockets)

    @property
    def fds(self) -> tuple[int, int]:
        return (self._read_fd, self._write_fd)

    def record(self, signum: int, frame: FrameType | None = None) -> None:
        """The signal handler: note the signal, nothing else."""
        if signum == signal.SIGCHLD:
            self.child_exited = True
        else:
            self.queue.append(signum)

    @property
    def pending(self) -> bool:
        return bool(self.queue) or self.child_exited

    def install(self) -> None:
        self._old_wakeup_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for signum in HANDLED:
            self._previous[signum] = signal.signal(signum, self.record)

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]
        self._previous.clear()
        signal.set_wakeup_fd(-1 if self._old_wakeup_fd is None else self._old_wakeup_fd)

    def wait(self, timeout: float) -> None:
        """Sleep until a signal arrives or ``timeout`` seconds pass, then empty the pipe."""
        if not self.pending:
            with contextlib.suppress(InterruptedError):
                readable((self._read_fd, *self.extra_fds), max(0.0, timeout))
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read_fd, 512):
                pass

    def pop_all(self) -> list[int]:
        """The action signals recorded since the last call, oldest first; clears the reap flag."""
        self.child_exited = False
        items, self.queue = self.queue, []
        return items

    def close(self) -> None:
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def reset_in_child(self) -> None:
        """In a forked child (signals still blocked): forget the parent's handlers and pipe.

        ``run_worker`` then installs the worker's own TERM/INT/QUIT handlers and unblocks.
        """
        signal.set_wakeup_fd(-1)
        for signum in HANDLED:
            signal.signal(signum, signal.SIG_DFL)
        self._previous.clear()
        self.queue = []
        self.child_exited = False
        self.close()


@contextlib.contextmanager
def blocked(signums: frozenset[int] = BLOCKED_ACROSS_FORK) -> Iterator[None]:
    """Block ``signums`` in this thread; restore the previous mask on exit (parent side)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
