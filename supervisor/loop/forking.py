"""Fork one worker process. The only place that calls ``os.fork``.

At the moment of fork the parent holds no database connection (the supervisor opens a store
only inside a step and closes it before any fork; ``StoreGate`` asserts it) and runs no thread
besides the main one. The stop signals are blocked across ``fork()``; the child resets the
parent's handlers, closes the parent's pipe and pidfile lock, and calls ``run_worker``, which
installs the worker's handlers and only then unblocks. The child never returns into the
parent's code: ``os._exit`` in a ``finally``.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from workerproc import App
from workerproc import exitcodes as wexit
from workerproc.identity import make_owner
from workerproc.runner import WorkerConfig, run_worker
from workerproc.status import StatusBoard

from ..errors import SupervisorError
from .signals import SignalInbox, blocked


@dataclass
class ForkContext:
    """What a forked child needs, and what it must let go of."""

    app: App
    worker_config: Callable[[int | None], WorkerConfig]  # max_tasks -> config
    board: StatusBoard
    inbox: SignalInbox
    before_fork: Callable[[], None]  # asserts: no open store, no extra thread
    child_cleanup: Callable[[], None]  # e.g. close the pidfile lock


def other_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t is not threading.main_thread()]


def _assert_single_threaded() -> None:
    if others := other_threads():
        raise SupervisorError(f"refusing to fork with threads running: {', '.join(others)}")


def fork_worker(ctx: ForkContext, slot: int, max_tasks: int | None) -> tuple[int, str]:
    """Fork a worker for status slot ``slot``; return (pid, owner) in the parent."""
    ctx.before_fork()
    _assert_single_threaded()
    suffix = secrets.token_hex(4)  # chosen before fork: parent and child derive the same owner
    config = ctx.worker_config(max_tasks)
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    with blocked():
        pid = os.fork()
        if pid == 0:  # the child: never leaves this block
            code = wexit.BOOT_FAILURE
            try:
                ctx.inbox.reset_in_child()
                ctx.child_cleanup()
                board_slot = ctx.board.slot(slot)
                code = run_worker(
                    ctx.app,
                    config,
                    owner=make_owner(suffix=suffix),
                    slot=board_slot,
                    parent_pid=parent,
                )
            except BaseException:  # the child must reach os._exit
                traceback.print_exc()
                code = 1
            finally:
                try:
                    logging.shutdown()
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
    try:
        owner = make_owner(pid=pid, suffix=suffix)
    except psutil.Error:  # gone already: it held no lease, nothing to release
        owner = f"unknown:{pid}:0:{suffix}"
    return pid, owner
