"""Entry point of a worker process: load the app, set up signals and orphan protection, open the
store (after fork, in this process), and run the claim loop. Used by the supervisor's forked
children and by ``python -m workerproc``."""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import logging
import os
import signal
import sys
from functools import partial
from typing import Any

from . import exitcodes
from .app import App
from .config import WorkerConfig
from .identity import make_owner
from .status import StatusSlot
from .store import Store, StoreCorrupt, StoreError, open_store
from .waker import Waker
from .worker import INTERRUPT, Worker

__all__ = ["AppLoadError", "WorkerConfig", "exit_with_parent", "load_app", "run_worker"]

log = logging.getLogger("workerproc")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
PARENT_SIGNALS = (signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD, signal.SIGUSR2)
PR_SET_PDEATHSIG = 1


class AppLoadError(Exception):
    """The app spec cannot be imported or does not name an App."""


def load_app(spec: str) -> App:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppLoadError(f"--app must look like package.module:attr, got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: the current directory is importable
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise AppLoadError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from None
    try:
        app = getattr(module, attr)
    except AttributeError:
        raise AppLoadError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(app, App):
        raise AppLoadError(f"{spec} is a {type(app).__name__}, not a workerproc.App")
    return app


def exit_with_parent(parent_pid: int) -> bool:
    """Ask Linux to SIGKILL us when the parent dies (PR_SET_PDEATHSIG); True if the parent is
    still ``parent_pid`` afterwards (it may have died before we asked)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the getppid() check in the loop remains
    return os.getppid() == parent_pid


def install_signals(worker: Worker, waker: Waker) -> None:
    """The worker's own handlers, then unblock what the supervisor blocked across fork."""
    signal.signal(signal.SIGTERM, worker.on_stop_signal)
    signal.signal(signal.SIGINT, worker.on_stop_signal)
    signal.signal(signal.SIGQUIT, worker.on_quit_signal)
    signal.signal(INTERRUPT, worker.on_interrupt_signal)
    for sig in (signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)  # the supervisor's business, not ours
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.set_wakeup_fd(waker.wfd, warn_on_full_buffer=False)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {*STOP_SIGNALS, *PARENT_SIGNALS, INTERRUPT})


def run_worker(
    app: App,
    config: WorkerConfig,
    *,
    owner: str | None = None,
    slot: StatusSlot | None = None,
    parent_pid: int | None = None,
    store_options: dict[str, Any] | None = None,
) -> int:
    """Run one worker in this process until it is asked to stop; return its exit code.

    ``parent_pid``: die with that parent (the supervisor passes its pid).
    """
    try:
        config.validate()
    except ValueError as exc:
        log.error("invalid worker configuration: %s", exc)
        return exitcodes.BOOT_FAILURE
    if parent_pid is not None and not exit_with_parent(parent_pid):
        return exitcodes.PARENT_DIED
    owner = owner or make_owner()
    options: dict[str, Any] = store_options or {}
    waker = Waker()
    try:
        store = open_store(config.db, **options)
    except StoreCorrupt as exc:
        log.error("worker cannot use the store, the database is corrupt: %s", exc)
        return exitcodes.STORE_CORRUPT
    except StoreError as exc:
        log.error("worker cannot open the store: %s", exc)
        return exitcodes.BOOT_FAILURE
    # the heartbeat's own connection fails fast on a busy database and retries on its schedule
    hb_busy = max(0.05, min(5.0, config.interval / 2))
    worker = Worker(
        store,
        app,
        config,
        owner=owner,
        open_store=partial(open_store, config.db, **{**options, "busy_timeout": hb_busy}),
        waker=waker,
        slot=slot,
        parent_pid=parent_pid,
    )
    install_signals(worker, waker)
    log.info("worker %s started (owner %s)", os.getpid(), owner)
    try:
        return worker.run()
    except StoreCorrupt as exc:  # restarting cannot help: stop the pool (the supervisor does)
        log.error("worker stopping, the database is corrupt: %s", exc)
        return exitcodes.STORE_CORRUPT
    except StoreError as exc:  # anything else after boot is a crash: the supervisor restarts
        log.error("worker crashed on a store error: %s", exc)
        return exitcodes.STORE_ERROR
    finally:
        _close(store)
        signal.set_wakeup_fd(-1)
        waker.close()


def _close(store: Store) -> None:
    with contextlib.suppress(StoreError):
        store.close()
