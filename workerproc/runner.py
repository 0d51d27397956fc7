"""Entry point of a worker process: load the app, set up signals and orphan protection, open the
store (after fork, in this process), and run the claim loop. Used by the supervisor's forked
children and by ``python -m workerproc``."""

from __future__ import annotations

import contextlib
import ctypes
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
from .loading import AppLoadError, load_app
from .logs import event, set_worker
from .signals import Waker
from .status import StatusSlot
from .store import StoreCorrupt, StoreError, WorkerStore, is_postgres_url, open_store
from .worker import Worker

__all__ = ["AppLoadError", "WorkerConfig", "exit_with_parent", "load_app", "run_worker"]

log = logging.getLogger("workerproc")

PR_SET_PDEATHSIG = 1
# On PostgreSQL the server ends a session idle inside a transaction for this share of the lease
# ttl: a worker frozen mid-exchange (SIGSTOP, a frozen VM) holds its runs' row locks no longer,
# so they are free to take over long before the leases could expire.
LOCK_HOLD_SHARE = 0.25


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


def delivery_options(db: str, options: dict[str, Any]) -> dict[str, Any]:
    """The webhook deliveries' own connections (B20): each moves its webhook's position once
    per acknowledged POST, a commit that need not wait for the disk (``synchronous=NORMAL`` on
    SQLite; on PostgreSQL the move's own statement says so): a crash of the machine may undo
    the newest moves, and those events are sent again (at least once holds); a crash of the
    process undoes nothing."""
    return options if is_postgres_url(db) else {**options, "synchronous": "NORMAL"}


def stream_options(db: str, options: dict[str, Any]) -> dict[str, Any]:
    """The stream writer's own connection (B21): a batch's commit need not wait for the disk
    (``synchronous=NORMAL`` on SQLite; on PostgreSQL the batch's own statement says so). The
    log is written in order, so the step's own commit, which does wait, makes every batch
    written before it durable too: a crash of the machine may undo only the newest batches of
    a step that has not committed, whose next attempt begins with a reset anyway."""
    return options if is_postgres_url(db) else {**options, "synchronous": "NORMAL"}


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
        event(
            log,
            "worker_config_invalid",
            f"invalid worker configuration: {exc}",
            level=logging.ERROR,
        )
        return exitcodes.BOOT_FAILURE
    if parent_pid is not None and not exit_with_parent(parent_pid):
        return exitcodes.PARENT_DIED
    owner = owner or make_owner()
    set_worker(None if slot is None else slot.index)  # what a handler's log records carry
    options: dict[str, Any] = dict(store_options or {})
    if is_postgres_url(config.db):  # a stopped worker's transaction ends well inside its ttl
        options.setdefault("idle_in_transaction", config.lease_ttl * LOCK_HOLD_SHARE)
        options.setdefault("network_timeout", max(1.0, config.lease_ttl * LOCK_HOLD_SHARE))
    waker = Waker()
    try:
        store = open_store(config.db, **options)
    except StoreCorrupt as exc:
        event(
            log,
            "database_corrupt",
            f"worker cannot use the store, the database is corrupt: {exc}",
            level=logging.ERROR,
        )
        return exitcodes.STORE_CORRUPT
    except StoreError as exc:
        event(log, "store_unreachable", f"worker cannot open the store: {exc}", level=logging.ERROR)
        return exitcodes.BOOT_FAILURE
    # the heartbeat's own connection fails fast on a busy database and retries on its schedule
    hb_busy = max(0.05, min(5.0, config.interval / 2))
    worker = Worker(
        store,
        app,
        config,
        owner=owner,
        open_store=partial(open_store, config.db, **{**options, "busy_timeout": hb_busy}),
        call_store=partial(open_store, config.db, **options),
        delivery_store=partial(open_store, config.db, **delivery_options(config.db, options)),
        stream_store=partial(open_store, config.db, **stream_options(config.db, options)),
        waker=waker,
        slot=slot,
        parent_pid=parent_pid,
    )
    worker.signals.install(waker)
    event(
        log,
        "worker_running",
        f"worker {os.getpid()} started (owner {owner})",
        owner=owner,
        concurrency=config.concurrency,
    )
    try:
        return worker.run()
    except StoreCorrupt as exc:  # restarting cannot help: stop the pool (the supervisor does)
        event(
            log,
            "database_corrupt",
            f"worker stopping, the database is corrupt: {exc}",
            level=logging.ERROR,
        )
        return exitcodes.STORE_CORRUPT
    except StoreError as exc:  # anything else after boot is a crash: the supervisor restarts
        event(log, "store_error", f"worker crashed on a store error: {exc}", level=logging.ERROR)
        return exitcodes.STORE_ERROR
    finally:
        _close(store)
        signal.set_wakeup_fd(-1)
        waker.close()


def _close(store: WorkerStore) -> None:
    with contextlib.suppress(StoreError):
        store.close()
