"""Starting waiting leases on free slots, each only on a lease confirmed a moment ago (R4's start
rule: ``startrule.py``, applied by ``Policy.start``).

The conductor starts what waits at each turn (``start_waiting``, which hands it each execution
to submit, one at a time, so that it hears of an inline handler's ending before the next
start): a lease confirmed within
``fresh`` starts at once; an older one is renewed first, synchronously, every such lease of the
turn in one statement (``Heartbeat.confirm``), and starts on the renewal's answer however long
its round trip took; a refused renewal (another worker took the task over) never starts. A slot
thread whose handler ended starts the next waiting lease itself (``next_for_thread``) when it has
a plain handler and a fresh lease, so short tasks never wait for a conductor turn; anything else
is left to the conductor. Either way the check and the move into ``running`` are one step under
the holdings' lock, and each start carries its deadline to the thread that calls the handler
(``Execution.gate``: the last checks, immediately before the call and at the handler's first
read of its task). A webhook delivery starts on a free slot of the delivery lane
(``Mode.LANE``, B20), under the same rule, and never on a users' slot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from .app import App, Handler
from .completer import Completer
from .execution import Execution, Mode, mode_for
from .heartbeat import Heartbeat
from .holdings import Holdings
from .once import CallBook
from .policy import CONFIRM_WAIT, Policy, Start
from .signals import Waker
from .store import Commit, Lease
from .streaming import Streamer


class Starter:
    def __init__(
        self,
        app: App,
        holdings: Holdings,
        policy: Policy,
        heartbeat: Heartbeat,
        completer: Completer,
        waker: Waker,
        *,
        calls: CallBook | None = None,
        streams: Streamer | None = None,
        builtin: Mapping[str, Handler] | None = None,
        batcher: Callable[[Execution], None] | None = None,
    ) -> None:
        # the app's handlers, and the built-in tasks the app does not define itself
        self.handlers = {**(builtin or {}), **app.handlers}
        self.calls = calls  # the worker's paid calls (``ctx.once``)
        self.streams = streams  # the worker's stream writer (``ctx.emit``)
        self.tasks = app.tasks
        self.holdings = holdings
        self.policy = policy
        self.heartbeat = heartbeat
        self.completer = completer
        self.waker = waker
        self.batcher = batcher  # runs a batch step's executions (``batcher.py``)

    def start_waiting(self) -> Iterator[Execution]:
        """Start waiting leases on the free slots (the conductor's turn): each execution, in
        ``running`` already, is the conductor's to submit to its executor."""
        vouched: dict[int, float] | None = None  # renewed at this turn's request: may start
        h, policy = self.holdings, self.policy
        while policy.accepting:
            with h.lock:
                if (lease := self._startable()) is None:
                    return
            confirmed = self.heartbeat.confirmed_at(lease)
            recorded = self.heartbeat.recorded(lease)
            asked = vouched.get(lease.task_id) if vouched is not None else None
            start = policy.start(confirmed, asked, vouched is not None, recorded)
            if start is Start.DROP:  # lost while it waited: never start it
                self.drop(lease)
                continue
            if start is Start.LATER:
                return  # renewed once this turn and not answered: the next turn tries again
            if start is Start.RENEW:
                vouched = self._confirm_waiting()
                continue
            assert confirmed is not None
            with h.lock:
                if self._startable() is not lease:
                    continue  # lost (or handed back) meanwhile
                h.take(lease)
                handler = self.handlers.get(lease.task)
                ex = None
                if handler is not None:
                    lane = h.lane_lease(lease)  # a delivery: the lane's slot, never a user's
                    mode = Mode.LANE if lane else self._mode(lease, handler)
                    ex = self._execution(lease, handler, mode)
                    self._gate(ex, confirmed)
                    h.begin(ex)
            if ex is None:
                error = f"UnknownTask: no handler named {lease.task!r} in this app"
                self.completer.add(Commit(lease, "fail", reason="unknown_task", error=error))
                continue
            self.heartbeat.started(lease)
            yield ex

    def _startable(self) -> Lease | None:
        """The next waiting lease a free slot may start (holding the holdings' lock): a
        delivery on a free slot of the lane first (an inline handler, started next, holds
        the conductor until it returns), then a users' one on a users' slot."""
        h, policy = self.holdings, self.policy
        if policy.lane_free(h.lane) and (lease := h.startable(users=False, lane=True)):
            return lease
        return h.startable(users=policy.slot_free(h.users()), lane=False)

    def next_for_thread(self) -> Execution | None:
        """What a slot thread whose handler ended runs next: the next waiting lease, when it
        has a plain handler and is fresh, taken into ``running`` at once. None: nothing, or
        not this thread's to start (an async or unknown task, a lease to renew first,
        draining): the conductor is woken for it."""
        h, policy = self.holdings, self.policy
        with h.lock:
            if not (h.waiting and policy.slot_free(h.users()) and policy.accepting):
                return None
            lease = h.startable(users=True, lane=False)  # (a delivery is the conductor's)
            if lease is None:
                return None
            handler = self.handlers.get(lease.task)
            if handler is None or self._mode(lease, handler) is not Mode.THREAD:
                return None
            confirmed = self.heartbeat.confirmed_at(lease)
            if not policy.thread_may_start(confirmed, self.heartbeat.recorded(lease)):
                self.waker.wake()  # to be renewed (and its start recorded) first, or dropped
                return None
            assert confirmed is not None
            h.take(lease)
            nxt = self._execution(lease, handler, Mode.THREAD)
            h.begin(nxt)
            self._gate(nxt, confirmed)
        self.heartbeat.started(lease)
        return nxt

    def _batched(self, lease: Lease) -> bool:
        """Whether ``lease`` is a batch step's (``@app.task(batch=...)``)."""
        task = self.tasks.get(lease.task)
        return self.batcher is not None and task is not None and task.batch is not None

    def _mode(self, lease: Lease, handler: Handler) -> Mode:
        """A batch runs on a slot thread (its items fail alone: nothing interrupts the call)."""
        return Mode.THREAD if self._batched(lease) else mode_for(handler, self.policy.capacity)

    def _execution(self, lease: Lease, handler: Handler, mode: Mode) -> Execution:
        """The execution of ``lease``: a batch's leader when its task is a batch step."""
        if mode is not Mode.LANE and self._batched(lease):
            return Execution(lease, handler, Mode.THREAD, tasks=self.tasks, calls=self.calls,
                             streams=self.streams, item=True, batcher=self.batcher)  # fmt: skip
        return Execution(lease, handler, mode, tasks=self.tasks, calls=self.calls,
                         streams=self.streams)  # fmt: skip

    def drop(self, lease: Lease) -> None:
        """A waiting lease that was lost before it started: forget it, write nothing."""
        self.holdings.drop_waiting(lease)
        self.heartbeat.untrack([lease], wait=False)

    def _gate(self, ex: Execution, confirmed: float) -> None:
        lease = ex.lease
        ex.gate(
            confirmed, self.policy.begin_by(confirmed), lambda: self.heartbeat.confirmed_at(lease)
        )

    def _confirm_waiting(self) -> dict[int, float]:
        """Renew, in one round of the heartbeat, every lease that waits for one of the free
        slots and is no longer fresh (or whose start the database has not recorded: a
        prefetch, B3), and wait for it; the round records their start. Returns when each lease
        the database confirmed was sent its renewal: they may start this turn however long the
        round trip took (their window counts from that moment). A refused one is dropped as
        lost."""
        h = self.holdings
        with h.lock:  # as many as each kind of slot has free: the users' and the lane's
            free = {False: self.policy.capacity - h.users(),
                    True: self.policy.lane_capacity - h.lane}  # fmt: skip
            waiting = []
            for w in h.waiting:
                kind = h.lane_lease(w)
                if w.task_id not in h.running and free[kind] > 0:
                    waiting.append(w)
                    free[kind] -= 1
        hb = self.heartbeat
        renew = self.policy.needs_renewal((hb.confirmed_at(w), hb.recorded(w)) for w in waiting)
        stale = [w for w, old in zip(waiting, renew, strict=True) if old]
        if not stale:
            return {}
        confirmed = self.heartbeat.confirm(stale, timeout=CONFIRM_WAIT)
        for lease in stale:
            if lease.task_id not in confirmed and self.heartbeat.confirmed_at(lease) is None:
                self.drop(lease)  # refused: taken over while it waited
        return confirmed
