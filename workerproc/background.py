"""A small daemon thread of a worker with its own store: the schedules' firer (``ticker``) and
the webhooks' waker (``courier``). It opens its store on its own thread (no connection crosses
a thread), looks, waits (every wait bounded, ``close`` ends it), and dies alone: its death is
logged once and the worker's own loop goes on."""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Callable

from .logs import event
from .outage import Outage
from .signals import main_thread_only
from .store import WorkerStore

log = logging.getLogger("workerproc.worker")


class StoreThread(abc.ABC):
    name = "background"  # the thread's name, and the event logged when it dies: <name>_died
    what = "a background thread"  # what the log line calls it

    def __init__(self, open_store: Callable[[], WorkerStore], outage: Outage) -> None:
        self._open_store = open_store
        self._outage = outage
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @abc.abstractmethod
    def turn(self, store: WorkerStore) -> None:
        """One look, and the (bounded) wait before the next; returns early once closed."""

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
