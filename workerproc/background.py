"""A small daemon thread of a worker with its own store: the schedules' firer (``ticker``) and
the webhooks' waker (``courier``). It opens its store on its own thread (no connection crosses
a thread), looks, waits (every wait bounded, ``close`` ends it at once: a self-pipe wakes it),
and dies alone: its death is logged once and the worker's own loop goes on."""

from __future__ import annotations

import abc
import contextlib
import logging
import threading
import time
from collections.abc import Callable

from .logs import event
from .outage import Outage
from .signals import Waker, main_thread_only
from .store import CHANGE_CHECK, StoreCorrupt, StoreError, WorkerStore
from .store.dialect import SETTLE, WATCHED_CHECK
from .store.readiness import readable

log = logging.getLogger("workerproc.worker")

# Without a change watch (PostgreSQL behind a pooler, no inotify) a thread waits on the store's
# own ``wait_change`` in steps this long, looking at the stop between them.
SLICE = 0.1


class StoreThread(abc.ABC):
    name = "background"  # the thread's name, and the event logged when it dies: <name>_died
    what = "a background thread"  # what the log line calls it

    def __init__(self, open_store: Callable[[], WorkerStore], outage: Outage) -> None:
        self._open_store = open_store
        self._outage = outage
        self._stop = threading.Event()
        self._waker = Waker()  # written by ``close``: a sleep on the change watch ends at once
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._waker.wake()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self._waker.close()

    @abc.abstractmethod
    def turn(self, store: WorkerStore) -> None:
        """One look, and the (bounded) wait before the next; returns early once closed."""

    def sleep(self, seconds: float) -> bool:
        """Sleep ``seconds`` or until closed; whether it was closed."""
        return self._stop.wait(seconds)

    def wait_change(self, store: WorkerStore, token: int, seconds: float) -> bool:
        """Sleep until the store's change token differs from ``token`` (True), or ``seconds``
        pass or the thread is closed (False). On the store's change watch and the stop's
        self-pipe, reading the token when the watch says something may have changed and every
        ``WATCHED_CHECK`` anyway (the watch is a hint); never a short timer loop. Without a
        watch, the store's own ``wait_change`` in ``SLICE`` steps."""
        until = time.monotonic() + seconds
        try:
            watch = store.change_watch()
        except StoreCorrupt:
            raise
        except StoreError:
            watch = None
        hot_until = 0.0  # after the watch saw a write: poll until then (the commit may not be done)
        while not self._stop.is_set():
            left = until - time.monotonic()
            if left <= 0:
                return False
            fd = None if watch is None else watch.fileno()
            if fd is None:
                if store.wait_change(token, min(SLICE, left)) != token:
                    return True
                continue
            step = CHANGE_CHECK if time.monotonic() < hot_until else WATCHED_CHECK
            with contextlib.suppress(OSError, ValueError):  # (closed meanwhile: look again)
                readable((self._waker.rfd, fd), min(step, left))
            self._waker.drain()
            if self._stop.is_set():
                return False
            if watch is not None and watch.drain():
                hot_until = time.monotonic() + SETTLE
            if store.change_token() != token:
                return True
        return False

    def _main(self) -> None:
        main_thread_only()
        store: WorkerStore | None = None
        try:
            while not self._stop.is_set():
                if store is None:
                    store = self._open_store()
                self.turn(store)
        except BaseException as exc:
            event(log, f"{self.name}_died", f"{self.what} died: {exc!r}", level=logging.ERROR)
        finally:
            if store is not None:
                store.close()
