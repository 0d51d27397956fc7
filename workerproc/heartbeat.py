"""The heartbeat thread (R4): renews every lease the worker holds, in one statement per tick.

- Own connection: the thread opens its own store (never shares the conductor's).
- Single flight per worker: one thread, one renewal statement at a time. When the oldest lease
  is due (``interval`` after its last renewal), every lease still held is renewed at once, each
  fenced on its own (``renew_each``); a refused one is lost alone (``LeaseLost``) and the others
  go on.
- A lease is held from its claim to the commit that ends it (``track`` ... ``untrack``), so a
  prefetched task waiting for a slot and a finished one waiting for its batch stay alive too.
  Before a commit, ``untrack`` also waits for a renewal in flight, so none races the commit;
  ``untrack(wait=False)`` does not, for a lease no commit follows (lost) and for this thread's
  own reactions and chores (no renewal can be in flight while they run).
- A lease's last *confirmation* is the monotonic moment its last successful claim or renewal
  was *sent* (``confirmed_at``); the local deadline is that plus the ttl. A renewal that
  *errors* (database busy or locked) is retried soon, not a loss until that deadline.
- ``confirm``: the conductor asks for a renewal round now and waits for it, before it starts
  handlers on leases that waited (R4's start rule, ``workerproc/startrule.py``). That round
  also records their start in the database (``recorded``, B3): a lease claimed as waiting (a
  prefetch) spends no attempt if it lapses before then.
- A lease is held per task *and attempt*: this worker's own takeover of its older attempt (it
  paused past its lease) replaces it, the older one reported lost; a word about one attempt
  (``finished``, ``untrack``) never touches another.
  An older attempt whose handler began and has not returned stays watched (``_replaced``)
  until it does: its stuck check still fires, and the newer attempt, which waits for it to
  end, cannot wait for ever behind a handler that ignores ``LeaseLost``.
- ``task_timeout``: counted from ``started``; past it the lease is no longer renewed and
  ``TaskTimedOut`` is reported (unless its reaction says ``postpone``: not its fault yet, ask
  again in ``POSTPONE`` seconds; a handler that cannot run because another blocks the event
  loop). A lost lease whose handler has not finished a whole ttl later is reported
  ``HandlerStuck`` (the handler ignored ``LeaseLost``). A ttl of the process's own time: when the
  thread looks at that moment late (``LATE``: the process did not run, a pause), the handler
  gets a ttl from then instead, so one that returned as the process woke is not taken for stuck.
- A renewal that answers ``cancelled`` (the run was cancelled under a live lease, B15) is
  reported ``RunCancelled`` once for that lease; the lease is still renewed until the commit
  that ends it.
- Reports (its own death too, ``HeartbeatDied``) are posted as events (``events.py``); the
  thread knows nothing of what the worker does about them but the ``Reaction`` it is answered,
  which it carries out here, on its own connection (``_apply``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from .events import Post, Reaction
from .heartbeat_thread import Beats
from .held import Held
from .outage import Outage
from .overdue import OverdueWatch
from .presence import Presence
from .store import Lease, WorkerStore

MAX_WAIT = 1.0  # no wait outlasts this while a lease is held: one tracked meanwhile is looked
# at soon; with nothing held the thread sleeps until the next presence beat (``IDLE_WAIT`` at
# most), and the first lease tracked wakes it


class Heartbeat(Beats):
    """The heartbeat (the module's docstring): what the conductor calls; its thread's own
    side is ``Beats``' (``heartbeat_thread.py``)."""

    def __init__(
        self,
        open_store: Callable[[], WorkerStore],
        *,
        ttl: float,
        interval: float,
        post: Post,
        task_timeout: float | None = None,
        outage: Outage | None = None,
        presence: Presence | None = None,
    ) -> None:
        self._open_store = open_store
        self.presence = presence  # the worker's row in the store's worker list, kept here
        self._beat_at = 0.0  # monotonic: when the presence is next written (0: at once)
        self.outage = outage or Outage()  # shared with the exchange: one log per incident
        self.ttl = ttl
        self.interval = interval
        self.task_timeout = task_timeout
        self._post = post  # every report, as an event (``events.py``)
        self._cond = threading.Condition()
        self._held: dict[int, Held] = {}  # task id -> what we know of its lease
        # (task id, attempt) -> a lost older attempt replaced in ``_held`` by this worker's own
        # takeover, whose handler began and has not returned yet (its stuck check goes on)
        self._replaced: dict[tuple[int, int], Held] = {}
        self._busy = False  # a renewal (or a timeout or stuck callback) is in flight
        self._busy_since = 0.0  # monotonic: when it began
        self._closed = False
        self._urgent = False  # renew now (a stale lease is about to start)
        self._starting: dict[int, int] = {}  # task id -> attempt: record its start (``confirm``)
        self._chore: tuple[float, Callable[[], Reaction | None]] | None = None
        self.renewals = 0  # statements sent
        self._rounds_begun = 0  # renewal rounds sent ...
        self._rounds_ended = 0  # ... and ended (answered or failed): ``confirm`` waits on them
        self.idle_wait = min(MAX_WAIT, interval / 2)
        self._idle = False  # asleep with nothing held: ``track`` must wake it
        self._thread = threading.Thread(target=self._main, name="heartbeat", daemon=True)
        self._watch = OverdueWatch(self._cond, self._overdue, self._lose_overdue)  # (overdue.py)

    # -- called from the conductor --------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()
        self._watch.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def track(self, lease: Lease, lease_start: float) -> None:
        """Keep ``lease`` alive from its claim; ``lease_start`` is the monotonic time the claim
        began, so ``lease_start + ttl`` is a safe local deadline. No wake-up while leases are
        held: the thread looks again within ``idle_wait``, far inside the first renewal's due
        time; the first lease after an idle spell wakes it, and the overdue watch, which sleep
        without a tick while nothing is held. An older attempt of the same task still held here
        was taken over by this very claim: it is lost."""
        held = Held(lease, lease_start, lease_start + self.interval, recorded=lease.started)
        with self._cond:
            if self._idle or self._watch.idle:
                self._cond.notify_all()
            old = self._held.get(lease.task_id)
            self._held[lease.task_id] = held
            if old is None or old.lease.attempt >= lease.attempt:
                return
            if old.started is not None and not old.finished:  # its handler may still run
                self._replaced[(lease.task_id, old.lease.attempt)] = old
        if old.lost_at is None:
            self._lose(old, f"this worker took the task over as attempt {lease.attempt}")

    def _get(self, lease: Lease) -> Held | None:
        """What is held of ``lease``'s own attempt (None: another attempt, or nothing)."""
        held = self._held.get(lease.task_id)
        if held is not None and held.lease.attempt == lease.attempt:
            return held
        return self._replaced.get((lease.task_id, lease.attempt))

    def recorded(self, lease: Lease) -> bool:
        """Whether the database counts ``lease``'s handler as begun (B3): claimed to start at
        once, or confirmed by a renewal that recorded its start."""
        with self._cond:
            held = self._get(lease)
            return held is not None and held.recorded

    def confirmed_at(self, lease: Lease) -> float | None:
        """The monotonic moment the last confirmation of ``lease`` (its claim or a renewal) was
        sent; None when it is not held (committed, forgotten) or known lost. A moment, never an
        age: a pause between reading it and using it cannot make a stale lease look fresh."""
        with self._cond:
            held = self._get(lease)
            if held is None or held.lost_at is not None:
                return None
            return held.confirmed

    def confirm(self, leases: Iterable[Lease], timeout: float) -> dict[int, float]:
        """Renew now and wait for it: one round, one statement for every lease held (R4's
        renewal at start), which also records the start of ``leases`` (B3). Returns, for each
        of ``leases`` that a renewal sent after this call confirmed (and recorded), the
        monotonic moment it was sent; a lease missing from the answer is lost, or its renewal
        failed (busy) within ``timeout``."""
        wanted = {lease.task_id: lease.attempt for lease in leases}
        asked = time.monotonic()
        with self._cond:
            target = self._rounds_begun + 1  # a round in flight began before this call
            for task_id, attempt in wanted.items():  # the round records their start (B3)
                held = self._held.get(task_id)
                if held is not None and held.lease.attempt == attempt and not held.recorded:
                    self._starting[task_id] = attempt
            self._urgent = True
            self._cond.notify_all()
            self._cond.wait_for(
                lambda: self._rounds_ended >= target or self._closed, timeout=timeout
            )
            return {
                task_id: held.confirmed
                for task_id, attempt in wanted.items()
                if (held := self._held.get(task_id)) is not None
                and held.lease.attempt == attempt
                and held.lost_at is None
                and not held.cancelled  # a cancelled run's lease never starts
                and held.recorded
                and held.confirmed >= asked
            }

    def started(self, lease: Lease) -> None:
        """The handler of ``lease`` starts now: its task timeout (its own declared one, else
        ``task_timeout``) counts from here."""
        with self._cond:
            held = self._get(lease)
            if held is not None:
                held.started = time.monotonic()
                limit = lease.options.timeout or self.task_timeout  # the task's own (B11)
                if limit is not None:  # look again when it is due, not a tick later
                    held.timeout_at = held.started + limit
                    self._cond.notify_all()

    def finished(self, lease: Lease) -> None:
        """The handler of ``lease`` returned: keep renewing until its commit, check nothing."""
        with self._cond:
            held = self._get(lease)
            if held is not None:
                held.finished = True
            self._replaced.pop((lease.task_id, lease.attempt), None)

    def schedule_chore(self, at: float, chore: Callable[[], Reaction | None]) -> None:
        """Run ``chore`` on this thread at monotonic ``at`` unless cancelled first (one pending
        chore at most), and apply its reaction with this thread's connection: work the
        conductor cannot do while it runs an inline handler, like handing back the tasks
        prefetched behind it."""
        with self._cond:
            self._chore = (at, chore)
            self._cond.notify_all()

    def cancel_chore(self) -> None:
        with self._cond:
            self._chore = None

    def is_lost(self, lease: Lease) -> bool:
        with self._cond:
            held = self._get(lease)
            return held is not None and held.lost_at is not None

    def untrack(self, leases: Iterable[Lease], *, wait: bool = True, timeout: float = 30.0) -> None:
        """Stop renewing ``leases``. With ``wait`` (before their commit), also wait until no
        renewal is in flight (single flight, bounded by ``timeout``): none races the commit or
        lands after it, where its refusal would be false evidence of a zombie; nor does the
        commit go out while a timeout callback may be ending the process. Without: for leases
        no commit follows (lost ones), and on this thread, in its reactions and chores,
        where waiting would wait for itself."""
        with self._cond:
            # Forget first: no new renewal can start for them, so the wait cannot starve
            # behind a stream of renewals (the lock is not fair).
            for lease in leases:
                held = self._held.get(lease.task_id)
                if held is not None and held.lease.attempt == lease.attempt:
                    del self._held[lease.task_id]  # never another attempt's (a newer claim)
                self._replaced.pop((lease.task_id, lease.attempt), None)
                if self._starting.get(lease.task_id) == lease.attempt:
                    del self._starting[lease.task_id]
            if wait:
                self._cond.wait_for(lambda: not self._busy, timeout=timeout)

    def close(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._watch.close()
