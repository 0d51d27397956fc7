"""Fork one worker process, or one import probe. The only place that calls ``os.fork``.

At the moment of fork the parent holds no database connection (the supervisor opens a store
only inside a step and closes it before any fork; ``StoreGate`` asserts it) and runs no thread
besides the main one. The stop signals are blocked across ``fork()``; the child resets the
parent's handlers, closes the parent's pipe and pidfile lock, and calls ``run_worker``, which
installs the worker's handlers and only then unblocks. The child never returns into the
parent's code: ``os._exit`` in a ``finally``.

New code never runs in the parent. A worker of a reloaded generation imports the app itself,
after fork (``fresh_import``); before any such worker starts, a short-lived **import probe** child
imports the app the same way and writes one line to a pipe — ``ok`` or ``error <why>`` — then
exits, while the parent's loop keeps turning (it selects on the pipe).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from workerproc import App
from workerproc import exitcodes as wexit
from workerproc.identity import make_owner
from workerproc.runner import AppLoadError, WorkerConfig, exit_with_parent, load_app, run_worker
from workerproc.status import StatusBoard

from ..errors import SupervisorError
from ..logs import event
from .signals import BLOCKED_ACROSS_FORK, SignalInbox, blocked

OUR_PACKAGES = ("workerproc", "supervisor")
PROBE_MESSAGE_LIMIT = 2048  # one line; below PIPE_BUF, so the probe's single write is atomic
ERROR_LINE_LIMIT = 300


@dataclass
class ForkContext:
    """What a forked child needs, and what it must let go of."""

    app: App
    worker_config: Callable[[int | None], WorkerConfig]  # max_tasks -> config
    board: StatusBoard
    inbox: SignalInbox
    before_fork: Callable[[], None]  # asserts: no open store, no extra thread
    child_cleanup: Callable[[], None]  # e.g. close the pidfile lock
    app_spec: str = ""  # MODULE:ATTR, imported afresh by reloaded workers and the probe


def other_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t is not threading.main_thread()]


def _assert_single_threaded() -> None:
    if others := other_threads():
        raise SupervisorError(f"refusing to fork with threads running: {', '.join(others)}")


def one_line(text: str, limit: int = ERROR_LINE_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def import_fresh(spec: str) -> App:
    """Forget the app's package, then import it again from the code on disk (children only)."""
    module = spec.partition(":")[0]
    top = module.split(".")[0]
    if top in OUR_PACKAGES:  # never re-import ourselves: App would become another class
        top = module
    for name in list(sys.modules):
        if name == top or name.startswith(top + "."):
            del sys.modules[name]
    importlib.invalidate_caches()
    return load_app(spec)


def _import_error(spec: str, exc: BaseException) -> str:
    if isinstance(exc, AppLoadError):  # already says what and why
        return one_line(str(exc))
    return one_line(f"cannot import {spec!r}: {type(exc).__name__}: {exc}")


def fork_worker(
    ctx: ForkContext, slot: int, max_tasks: int | None, *, fresh_import: bool = False
) -> tuple[int, str]:
    """Fork a worker for status slot ``slot``; return (pid, owner) in the parent.

    ``fresh_import``: the child imports ``ctx.app_spec`` itself instead of using ``ctx.app``;
    when that fails it exits ``APP_IMPORT`` (77).
    """
    ctx.before_fork()
    _assert_single_threaded()
    suffix = os.urandom(4).hex()  # (secrets.token_hex's bytes, without loading hashlib)
    # chosen before fork: parent and child derive the same owner
    config = ctx.worker_config(max_tasks)
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    with blocked():
        pid = os.fork()
        if pid == 0:  # the child: never leaves this block
            code = wexit.BOOT_FAILURE
            try:
                code = _worker_child(ctx, slot, config, suffix, parent, fresh_import)
            except BaseException:  # the child must reach os._exit
                traceback.print_exc()
                code = 1
            finally:
                _exit(code)
    try:
        owner = make_owner(pid=pid, suffix=suffix)
    except psutil.Error:  # gone already: it held no lease, nothing to release
        owner = f"unknown:{pid}:0:{suffix}"
    return pid, owner


def _worker_child(
    ctx: ForkContext, slot: int, config: WorkerConfig, suffix: str, parent: int, fresh: bool
) -> int:
    ctx.inbox.reset_in_child()
    ctx.child_cleanup()
    app = ctx.app
    if fresh:
        if not exit_with_parent(parent):  # a slow import must not outlive the supervisor
            return wexit.PARENT_DIED
        try:
            app = import_fresh(ctx.app_spec)
        except BaseException as exc:
            error = _import_error(ctx.app_spec, exc)
            event(
                "worker_import_failed",
                f"worker {os.getpid()} cannot import the app: {error}",
                level=logging.ERROR,
                worker=os.getpid(),
                error=error,
            )
            return wexit.APP_IMPORT
    return run_worker(
        app, config, owner=make_owner(suffix=suffix), slot=ctx.board.slot(slot), parent_pid=parent
    )


def _exit(code: int) -> None:
    try:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


@dataclass
class ImportProbe:
    """The parent's end of a running import probe: its pid and the read end of its pipe."""

    pid: int
    fd: int
    _data: bytearray = field(default_factory=bytearray)
    eof: bool = False

    def read(self) -> bool:
        """Take what the pipe holds without blocking; True once the probe closed it."""
        while not self.eof:
            try:
                chunk = os.read(self.fd, 4096)
            except BlockingIOError:
                return False
            except OSError:
                chunk = b""
            if not chunk:
                self.eof = True
            elif len(self._data) < PROBE_MESSAGE_LIMIT:
                self._data += chunk[: PROBE_MESSAGE_LIMIT - len(self._data)]
        return True

    @property
    def message(self) -> str:
        return self._data.decode("utf-8", "replace").strip()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def fork_probe(ctx: ForkContext) -> ImportProbe:
    """Fork a child that imports ``ctx.app_spec`` afresh, reports one line and exits."""
    ctx.before_fork()
    _assert_single_threaded()
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(read_fd, False)
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    with blocked():
        try:
            pid = os.fork()
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            raise
        if pid == 0:
            code = 1
            try:
                os.close(read_fd)
                ctx.inbox.reset_in_child()
                ctx.child_cleanup()
                exit_with_parent(parent)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, BLOCKED_ACROSS_FORK)  # defaults now
                try:
                    app = import_fresh(ctx.app_spec)
                    message = f"ok {len(app.handlers)} tasks"
                except BaseException as exc:
                    message = "error " + _import_error(ctx.app_spec, exc)
                os.write(write_fd, message.encode()[:PROBE_MESSAGE_LIMIT])
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                _exit(code)
    os.close(write_fd)
    return ImportProbe(pid, read_fd)
