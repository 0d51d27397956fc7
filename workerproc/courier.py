"""The webhooks' waker (B20): a small thread in the first workers of each pool, with
its own store, beside the schedules' firer.

A delivery run that has delivered everything parks (``wait_for(WAKE_SIGNAL)``): no lease, no
slot, no poll. The waker watches the change token; when something commits, it reads the parked
webhooks' new events and signals each webhook that has one it wants, so delivery starts within
a change check of the event's commit. It only ever *sends a signal*: the delivering is the
delivery task's, under its lease (``delivery``). Two wakers (or two hosts) signalling the same
run cost one extra look at most. With no webhooks it reads the webhook list every ``REFRESH``
seconds; every wait is bounded, and a failing database is told once per incident.

Between looks it sleeps on the store's change watch and its stop pipe (``StoreThread``), and
before each look it reads the events' mark (``events_mark``: one indexed read, never the
numbering write a look costs on PostgreSQL): when no event committed since the last look, and
that look was less than ``LOOK_AGAIN`` seconds ago, there is nothing new to wake anyone for, and
it does not look (every webhook's park, wake, addition or removal commits an event too).

How often it reads the mark depends on what the change token tells (``commits_move_token``):

- where every commit moves it (SQLite), never while the token stands still: it sleeps on the
  change watch until something commits (or ``LOOK_AGAIN``);
- where only new work and watched ends notify (PostgreSQL over LISTEN; an event's commit sends
  no NOTIFY, which would take the server's global notification lock on the hot path), ``WATCH``
  after a look or a notification, then twice as long after each read that found nothing new, up
  to ``QUIET``. A user's events follow a claim of work whose enqueue notified, so while work
  moves it reads every second; an event that commits after a quiet spell with no notification
  (a long step's end) is seen within ``QUIET`` seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .background import StoreThread
from .logs import event as told
from .outage import Outage
from .store import StoreError, WorkerStore
from .store.protocol.webhooks import PARKED
from .store.webhooks import Webhook

log = logging.getLogger("workerproc.worker")

REFRESH = 5.0  # with no parked webhook: look at the list this often
WATCH = 1.0  # with parked webhooks, after a look or a notification: the next mark read this soon
QUIET = 4.0  # ... doubling while nothing moves, up to this (where a commit may notify nobody)
LOOK_AGAIN = 60.0  # a look even when the mark says nothing committed (a safety net)
RETRY = 1.0  # after a failed look
GAP = 0.1  # the shortest time between looks: a busy pool's commits wake it at most this often
LOOK = 1000  # events read per look at most


class Courier(StoreThread):
    name = "courier"
    what = "the webhooks' waker (parked deliveries look again after their timeout)"

    def __init__(self, open_store: Callable[[], WorkerStore], outage: Outage) -> None:
        super().__init__(open_store, outage)
        self._seen: dict[int, int] = {}  # delivery run -> the last event id looked at for it
        self.woken = 0  # signals this waker sent
        self._broken = False
        self._mark: int | None = None  # the events' mark read before the last look that watched
        self._looked = 0.0  # monotonic: when that look was
        self._every = WATCH  # the next mark read after this long (doubles while quiet)
        self._moved = True  # the change token moved during the last watch

    def turn(self, store: WorkerStore) -> None:
        token = store.change_token()
        if self._quiet(store):
            pause = self._watch(store)
        else:
            looked = self.step(store)
            if looked is None or looked >= REFRESH:  # a failed look, or no parked webhook
                self.sleep(RETRY if looked is None else looked)
                return
            pause = self._every = looked
        if self.sleep(GAP):
            return
        # on the change watch and the stop's self-pipe: a stopping worker is never held up
        self._moved = self.wait_change(store, token, max(GAP, pause - GAP))

    def _quiet(self, store: WorkerStore) -> bool:
        """No event committed since the last look, which watched less than ``LOOK_AGAIN`` ago
        (where every commit moves the change token, a token that stood still says so alone)."""
        if self._mark is None or time.monotonic() - self._looked >= LOOK_AGAIN:
            return False
        try:
            if not self._moved and store.commits_move_token():
                return True
            return store.events_mark() == self._mark
        except StoreError:
            return False  # (the look tells the outage)

    def _watch(self, store: WorkerStore) -> float:
        """Quiet: how long to watch for a change before the next mark read."""
        until_look = max(GAP, LOOK_AGAIN - (time.monotonic() - self._looked))
        try:
            if store.commits_move_token():
                return until_look  # (any commit wakes it)
        except StoreError:
            return WATCH
        # a notification (new work: its events follow) reads again soon; else less often
        self._every = WATCH if self._moved else min(QUIET, self._every * 2)
        return min(self._every, until_look)

    def step(self, store: WorkerStore) -> float | None:
        """Signal every parked webhook that has an event it wants; the seconds to watch for a
        change before the next look (None: the look failed, try again after ``RETRY``)."""
        self._mark = None
        try:
            mark = store.events_mark()  # (before the look: what commits during it moves it)
            looked = time.monotonic()
            pause = self._look(store)
        except StoreError as exc:
            self._outage.failed("webhooks", exc)
            return None
        except Exception as exc:  # told once, looked at again later
            if not self._broken:
                told(log, "courier_failed", f"cannot wake the webhooks: {exc!r}",
                     level=logging.ERROR)  # fmt: skip
            self._broken = True
            return REFRESH
        self._broken = False
        self._outage.answered()
        if pause < REFRESH and mark >= 0:  # watching (a -1: an event waits for its number)
            self._mark, self._looked = mark, looked
        return pause

    def _look(self, store: WorkerStore) -> float:
        hooks = store.webhook_list()
        parked: list[tuple[Webhook, int]] = []
        for hook in hooks:
            run = store.get_run(hook.run_id)
            if run is None or run.terminal or run.waiting_for != PARKED:
                self._seen.pop(hook.run_id, None)
                continue
            parked.append((hook, max(hook.position, self._seen.get(hook.run_id, 0))))
        if not parked:
            return REFRESH if not hooks else WATCH
        # (the system's events too, which no webhook takes: read past, so the next look
        # starts after them rather than scanning them again)
        events = store.events(after=min(start for _, start in parked), limit=LOOK, system=True)
        for hook, start in parked:
            wanted = any(e.id > start and hook.takes(e) for e in events)
            if wanted:
                if store.wake_webhook(hook.run_id):  # (False: another waker was first)
                    self.woken += 1
                self._seen.pop(hook.run_id, None)
            elif events:
                self._seen[hook.run_id] = max(start, events[-1].id)
        return WATCH
