"""The worker's decisions, made pure: no thread, no store, no lease object, an injectable clock.

The conductor (``worker.py``) reads what it holds into a ``View`` and asks; this module decides
and the conductor acts, the way the supervisor's loop runs its steps (``supervisor/loop``):

- **what to claim, and how many** (``Policy.turn``): the free slots, plus a prefetch: ``--prefetch
  K``, or by default ``ADAPTIVE_PREFETCH`` while the last ``RECENT`` handlers each took at most
  ``FAST``; none while the slots are slow, and none once the worker stops taking work. A claim
  alone is sent only when the last one got all it asked for (or something changed since) and the
  prefetched work runs low; a claim rides along with any write that is due anyway.
- **when finished commits are written** (``Policy.turn``): at once, unless prefetched work still
  runs here: then they wait for it (a bigger batch, fewer transactions), at most ``HOLD``.
- **when prefetched leases go back unstarted** (``Policy.turn``): when every slot is busy and the
  youngest handler has run for ``SLOW_BEHIND`` (what waits behind them would wait long: the
  adaptive prefetch is earned again from scratch), or when the worker stops taking work.
- **when a waiting lease may start** (``Policy.start``, R4's start rule, ``startrule.py``): at
  once when confirmed a moment ago, after a synchronous renewal when older, never when lost.
- **what the delivery lane claims** (``Policy.turn``, B20): webhook deliveries run on slots of
  their own (``lane``, beside ``--concurrency``, never counted against it); a free one asks for a
  delivery with every exchange while the last such ask found one, else at most every
  ``LANE_LOOK`` (or when something changed), alone if need be.
- **when to wake** (``Policy.wake_at``), **when to stop taking work and when to exit**
  (``Policy.drain``, ``Policy.drained``): TERM, recycling after ``--max-tasks``, a timeout that
  cost a slot; the running tasks finish first, bounded by ``--graceful-timeout``.
"""

from __future__ import annotations

import enum
import math
import random
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from . import exitcodes
from .config import WorkerConfig
from .signals import Signals
from .startrule import StartRule

FAST = 0.005  # a handler this quick makes prefetching worthwhile
ADAPTIVE_PREFETCH = 32  # the adaptive prefetch, while the recent handlers were all fast
RECENT = 16  # handler durations the adaptive prefetch looks at
BUSY_WAIT = 0.5  # with slots busy and none free, look at health this often
HOLD = 0.005  # finished slots wait at most this long for their batch while prefetched work runs
CONFIRM_WAIT = 5.0  # the longest a turn waits for the renewal of leases about to start
# A prefetched lease waits at most this long behind slots that turned out slow (20x what counts
# as a fast handler: a busy CPU's scheduling delays must not pass for slow handlers), then it
# goes back unstarted.
SLOW_BEHIND = 0.1
# A free slot of the delivery lane that found no delivery asks again after this long (sooner
# when something changes): a busy worker costs the database one small claim per this at most.
LANE_LOOK = 0.5


@dataclass(slots=True)
class View:
    """What the conductor holds at one moment (read in one step under its lock)."""

    running: int = 0  # the users' handlers running now
    youngest: float = -math.inf  # monotonic: the latest start among them (with every slot busy)
    waiting: int = 0  # prefetched leases waiting for a users' slot
    finished: int = 0  # commits waiting for the next exchange
    finished_since: float | None = None  # monotonic: when the oldest of them finished
    lane: int = 0  # the delivery lane's leases, running or waiting (never the users' slots)
    lane_waiting: int = 0  # of those, the ones waiting to start


@dataclass(frozen=True, slots=True)
class Turn:
    """What one turn of the conductor does with the store."""

    hand_back: bool  # give every waiting lease back, unstarted
    want: int  # leases to claim if the turn talks to the store (the free slots and the prefetch)
    write: bool  # the finished commits are due
    claim: bool  # claim, even with nothing to write
    start: int = 0  # of the leases claimed, how many begin at once (recorded as begun, B3)
    lane: int = 0  # deliveries the lane claims in the same exchange (its own slots, B20)

    @property
    def talks_to_store(self) -> bool:
        """Whether this turn talks to the store (one transaction: writes, then the claims)."""
        return self.hand_back or self.write or self.claim or bool(self.lane)


class Start(enum.Enum):
    """What becomes of the next waiting lease when a slot is free (R4's start rule)."""

    NOW = "now"  # confirmed a moment ago (or renewed at this turn's request): start it
    RENEW = "renew"  # older: renew it first, with every such lease of this turn, and wait
    LATER = "later"  # renewed once this turn and not confirmed by it: the next turn tries again
    DROP = "drop"  # lost while it waited: never start it


class Policy:
    """Decisions of one worker. ``signals`` is what the signals asked for (read, never written);
    ``clock`` is the monotonic clock the heartbeat's confirmations are measured on; ``lane``:
    the delivery lane's slots (0: the worker delivers no webhooks)."""

    def __init__(
        self,
        config: WorkerConfig,
        signals: Signals,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        lane: int = 0,
    ) -> None:
        self.capacity = config.concurrency
        self.lane_capacity = lane
        self._lane_ready = True  # the lane's last claim found all it asked for
        self._lane_look = -math.inf  # monotonic: when a free lane slot asks again regardless
        self.signals = signals
        self.clock = clock
        self.rule = StartRule(config.lease_ttl)
        self._config = config
        self._rng = rng or random.Random()
        self._recent: deque[float] = deque(maxlen=RECENT)  # the last handlers' durations
        self.tasks_done = 0
        self.drain_code: int | None = None  # stop claiming, finish the slots, exit this
        self.drain_until: float | None = None  # ... or give up on them then
        self._maybe_ready = True  # the last claim got all it asked for (or something changed)

    # -- taking work ------------------------------------------------------------------------------
    @property
    def accepting(self) -> bool:
        """Whether the worker takes work: no TERM, no drain."""
        return self.signals.stop is None and self.drain_code is None

    def task_done(self, seconds: float) -> None:
        """A handler ran for ``seconds`` (one that never began does not count)."""
        self._recent.append(seconds)
        self.tasks_done += 1

    @property
    def recycle_due(self) -> bool:
        """``--max-tasks`` tasks are done: time to drain (``exitcodes.RECYCLE``)."""
        limit = self._config.max_tasks
        return limit is not None and self.tasks_done >= limit

    def slow_after_all(self) -> None:
        """The prefetched work went back behind slow slots: prefetch again only after RECENT
        fast handlers."""
        self._recent.clear()

    def slow_behind(self, view: View, now: float) -> bool:
        """Every slot is busy, and the youngest handler has run for SLOW_BEHIND: what waits
        behind them would wait long (so it goes back, and no more is prefetched meanwhile)."""
        return view.running >= self.capacity and now - view.youngest >= SLOW_BEHIND

    def prefetch(self, slow: bool) -> int:
        """How many leases to hold beyond the free slots."""
        if slow:  # what it would claim would only go back again
            return 0
        if self._config.prefetch is not None:
            return self._config.prefetch
        return ADAPTIVE_PREFETCH if self.fast else 0

    @property
    def fast(self) -> bool:
        """The last ``RECENT`` handlers each took at most ``FAST``."""
        recent = self._recent
        return len(recent) == RECENT and max(recent) <= FAST

    def turn(self, view: View) -> Turn:
        """What this turn does with the store, from what the conductor holds now. Deciding to
        hand back behind slow slots (while taking work) forgets the recent fast handlers."""
        now = self.clock()
        accepting = self.accepting
        slow = self.slow_behind(view, now)
        hand_back = bool(view.waiting) and (slow or not accepting)
        hand_back = hand_back or (bool(view.lane_waiting) and not accepting)
        if hand_back and accepting:
            self.slow_after_all()
        waiting = 0 if hand_back else view.waiting
        want = 0
        if accepting:
            want = max(0, self.capacity + self.prefetch(slow) - view.running - waiting)
        write = False
        if view.finished:
            if not waiting or not accepting:
                write = True
            else:
                held = now - (view.finished_since or 0.0)
                write = held >= HOLD or view.finished >= self.capacity + ADAPTIVE_PREFETCH
        claim = bool(want) and self._maybe_ready and waiting <= self.capacity
        lane = self.lane_want(view, now)
        # B3: what a claim records as begun. The leases for the slots free now begin at once;
        # a prefetch begins within milliseconds behind fast handlers (one that goes back after
        # all is handed back, which un-spends it), else it is claimed waiting: its start is
        # recorded by the renewal that confirms it, and a lapse before then spends nothing.
        free = max(0, self.capacity - view.running - waiting)
        start = want if self.fast else min(want, free)
        return Turn(hand_back, want, write, claim, start, lane)

    def lane_want(self, view: View, now: float) -> int:
        """How many deliveries the lane claims now: its free slots, while the worker takes
        work and the lane's last claim found all it asked for, or ``LANE_LOOK`` has passed."""
        free = self.lane_capacity - view.lane
        if free < 1 or not self.accepting:
            return 0
        return free if self._lane_ready or now >= self._lane_look else 0

    def claimed(self, asked: int, got: int) -> None:
        """A claim for ``asked`` leases got ``got``: fewer means the queue ran dry, so the next
        claim alone waits until something changes (``watched``)."""
        self._maybe_ready = got >= asked

    def lane_claimed(self, asked: int, got: int) -> None:
        """The lane's claim for ``asked`` deliveries got ``got``: fewer, and its free slots ask
        again only after ``LANE_LOOK`` (or a change)."""
        self._lane_ready = got >= asked
        if not self._lane_ready:
            self._lane_look = self.clock() + LANE_LOOK

    def watched(self) -> None:
        """The idle wait ended (a change, a due time, the poll interval): work may be ready."""
        self._maybe_ready = True
        self._lane_ready = True

    def nothing_due(self) -> None:
        """The idle wait's look at the poll interval found nothing of its queues claimable
        (the lane's queue among them): neither the slots nor the lane claim before the next
        change or interval, the lane's ``LANE_LOOK`` included."""
        self._lane_look = self.clock() + LANE_LOOK

    # -- starting (R4) ----------------------------------------------------------------------------
    def slot_free(self, running: int) -> bool:
        return running < self.capacity

    def lane_free(self, running: int) -> bool:
        """Whether the delivery lane has a free slot, ``running`` of its deliveries running."""
        return running < self.lane_capacity

    def start(
        self, confirmed: float | None, vouched: float | None, renewed: bool, recorded: bool = True
    ) -> Start:
        """Whether the next waiting lease, last confirmed at ``confirmed`` (None: lost), may
        start now. ``vouched``: when a renewal this turn asked for was sent for it (that
        renewal recorded its start); ``renewed``: this turn has asked for one already;
        ``recorded``: the database counts its handler as begun already (B3: a lease claimed
        to wait, a prefetch, is renewed first, and that renewal records its start)."""
        if confirmed is None:
            return Start.DROP
        if vouched is not None and vouched <= confirmed:
            return Start.NOW  # however long that renewal's round trip took
        if recorded and self.rule.is_fresh(confirmed, self.clock()):
            return Start.NOW
        return Start.LATER if renewed else Start.RENEW

    def needs_renewal(self, leases: Iterable[tuple[float | None, bool]]) -> list[bool]:
        """For each lease about to start, last confirmed at the moment given (None: unknown)
        and whether its start is recorded, whether it must be renewed first."""
        now = self.clock()
        return [c is None or not recorded or not self.rule.is_fresh(c, now)
                for c, recorded in leases]  # fmt: skip

    def thread_may_start(self, confirmed: float | None, recorded: bool = True) -> bool:
        """Whether a slot thread whose handler ended may start a waiting lease confirmed at
        ``confirmed`` itself; anything older, or not recorded as begun, is the conductor's (it
        renews first)."""
        return confirmed is not None and recorded and self.rule.is_fresh(confirmed, self.clock())

    def begin_by(self, confirmed: float) -> float:
        """The moment after which a lease confirmed at ``confirmed`` must not begin."""
        return self.rule.begin_by(confirmed)

    # -- waiting ----------------------------------------------------------------------------------
    def wake_at(self, view: View, want: int) -> float:
        """When the conductor's wait ends at the latest: the health look while slots are busy,
        a hand-back or a held batch coming due, or the poll interval (±10 % while idle and
        looking for work, so that idle workers do not wake together)."""
        now = self.clock()
        poll = self._config.poll_interval
        if want and not view.running:
            return now + poll * self._rng.uniform(0.9, 1.1)
        deadline = now + (BUSY_WAIT if view.running else poll)
        if view.waiting and view.running >= self.capacity:  # a hand-back may come due
            deadline = min(deadline, view.youngest + SLOW_BEHIND)
        if view.finished_since is not None:  # finished slots wait for their batch
            deadline = min(deadline, view.finished_since + HOLD)
        return deadline

    # -- stopping ---------------------------------------------------------------------------------
    def drain(self, code: int) -> bool:
        """Stop taking work; exit with ``code`` once the running tasks finished, or once
        --graceful-timeout has passed. False when a drain was under way already (it keeps its
        code and its deadline)."""
        if self.drain_code is not None:
            return False
        self.drain_code = code
        self.drain_until = self.clock() + self._config.graceful_timeout
        return True

    @property
    def overdue(self) -> bool:
        """The drain's --graceful-timeout has passed with slots still busy."""
        return self.drain_until is not None and self.clock() >= self.drain_until

    def drained(self, busy: bool) -> int | None:
        """The exit code once the worker takes no more work and nothing is left to do (``busy``:
        a live handler, an ending not collected yet, a waiting lease, a commit not written), or
        once the drain is overdue; None while it goes on."""
        if self.accepting:
            return None
        if busy and not self.overdue:
            return None
        return exitcodes.OK if self.drain_code is None else self.drain_code
