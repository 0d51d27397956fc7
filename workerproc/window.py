"""A webhook delivery's window (docs/protocol.md B20): up to the webhook's ``in_flight`` POSTs
at once (``WINDOW`` unless it says), across runs, each run's events one at a time and in table
order.

``Window`` is the bookkeeping alone (no thread, no clock of its own): the events read after
the webhook's position, in table order, each one passed over (a kind the webhook does not
want, or the system's), waiting, in flight, acknowledged, failed (tried again at a moment) or
given up on (a dead letter). An event may go when its run has no earlier event still to be
acknowledged and fewer than ``size`` events are *open* (sent and not yet below the position),
so a fault re-sends at most ``size`` events. The position is the highest event below which
every event was dealt with (contiguous): acknowledgements that come out of order move it only
once the gap before them closes.

``Senders`` are the threads that POST: each has its own ``Poster`` (one thread's connections,
as ``workerproc.posting`` needs, closed when the thread ends), takes one job at a time and
hands its answer back on the queue the job names, so a delivery that stopped (its lease lost)
never sees another's answers. An idle sender ends after ``IDLE_END`` seconds; every wait is bounded.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .store.types import Event
from .store.webhooks import IN_FLIGHT

# POSTs in flight per webhook at most unless it says (``RetryNumbers.in_flight``): its events
# open at most, what a fault re-sends
WINDOW = IN_FLIGHT
IDLE_END = 30.0  # an idle sender thread ends after this long

PASSED, WAITING, FLIGHT, ACKED, FAILED, DEAD = range(6)
_DEALT = (PASSED, ACKED)


@dataclass
class Slot:
    event: Event
    status: int
    due: float = 0.0  # FAILED: when it may be tried again (monotonic)
    failures: int = 0  # its failures in a row


@dataclass
class Window:
    """The events read after ``position``, in table order, and what became of each."""

    position: int  # every event up to here dealt with (what the webhook's row may say)
    size: int = WINDOW
    _slots: deque[Slot] = field(default_factory=deque)
    _open: int = 0  # events sent (in flight, acknowledged, failed, dead) above the position
    _flight: int = 0
    _failed: int = 0  # slots FAILED (waiting for their moment to be tried again)
    _carried: bool = False  # the first event still to send was given its carried failures

    @property
    def read_to(self) -> int:
        """The last event id read (where the next read starts)."""
        return self._slots[-1].event.id if self._slots else self.position

    @property
    def in_flight(self) -> int:
        return self._flight

    @property
    def full(self) -> bool:
        return self._open >= self.size

    def __len__(self) -> int:
        return len(self._slots)

    def add(
        self, events: Iterable[Event], takes: Callable[[Event], bool], carry: int = 0,
        done: frozenset[int] = frozenset(),
    ) -> None:  # fmt: skip
        """Events read after ``read_to``; those in ``done`` were acknowledged already (by an
        execution whose commit kept them: not sent again); the first one still to send starts
        with ``carry`` failures (the count a commit kept for the event after its cursor)."""
        for event in events:
            wanted = takes(event)
            slot = Slot(event, WAITING if wanted else PASSED)
            if wanted and event.id in done:
                slot.status = ACKED
                self._open += 1
            elif wanted and not self._carried:
                slot.failures, self._carried = carry, True
            self._slots.append(slot)

    def waiting(self) -> bool:
        """Whether any wanted event is still to be sent (or tried again)."""
        return bool(self._failed) or any(s.status == WAITING for s in self._slots)

    def next_due(self) -> float | None:
        """The earliest moment a failed event may be tried again, if any waits for one."""
        if not self._failed:
            return None
        return min(s.due for s in self._slots if s.status == FAILED)

    def sendable(self, now: float) -> Iterator[Slot]:
        """The slots that may go now, in table order: the first unfinished event of its run, a
        new one while the window has room, a failed one once its moment came. (The look ends
        once the window is full and no failed slot is left behind: a delivery asks after every
        round of answers, and a full window's slots after it could not go.)"""
        busy: set[int | None] = set()  # (events of no run: one after another too)
        failed = self._failed  # the failed slots not looked at yet
        for slot in self._slots:
            status = slot.status
            if not failed and self._open >= self.size:
                return  # (the caller's ``sent`` fills the window as it takes each one)
            if status in _DEALT:
                continue
            if status == FAILED:
                failed -= 1
            run = slot.event.run_id
            if run in busy:
                continue
            busy.add(run)  # (its later events wait for this one)
            if status == FAILED and slot.due <= now:
                yield slot  # (open already: a try again takes no room)
            elif status == WAITING and self._open < self.size:
                yield slot

    def sent(self, slot: Slot) -> None:
        if slot.status == WAITING:
            self._open += 1
        elif slot.status == FAILED:
            self._failed -= 1
        slot.status = FLIGHT
        self._flight += 1

    def acked(self, slot: Slot) -> None:
        slot.status, slot.failures = ACKED, 0
        self._flight -= 1

    def failed(self, slot: Slot, due: float) -> None:
        """Tried again at ``due``: its run's later events keep waiting."""
        slot.status, slot.due = FAILED, due
        self._flight -= 1
        self._failed += 1

    def dead(self, slot: Slot) -> None:
        """Given up on: dealt with once its dead letter is committed (``cursor``)."""
        slot.status = DEAD
        self._flight -= 1

    def advance(self) -> tuple[int, int]:
        """Drop the dealt-with events at the front (never past a dead letter, which moves only
        with the commit that keeps it): the new position and the acknowledged POSTs it passed."""
        acked = 0
        while self._slots and self._slots[0].status in _DEALT:
            slot = self._slots.popleft()
            if slot.status == ACKED:
                acked += 1
                self._open -= 1
            self.position = slot.event.id
        return self.position, acked

    def cursor(self) -> int:
        """Where a commit may say the delivery stands: past every dealt-with event at the front,
        and past dead letters too (they are committed with it)."""
        cursor = self.position
        for slot in self._slots:
            if slot.status not in (*_DEALT, DEAD):
                break
            cursor = slot.event.id
        return cursor

    def acked_after(self, cursor: int) -> list[int]:
        """The acknowledged events after ``cursor`` (behind one still unacknowledged: at most
        ``size``), which a commit keeps so the next execution does not send them again."""
        return [s.event.id for s in self._slots if s.status == ACKED and s.event.id > cursor]

    def failures_after(self, cursor: int) -> int | None:
        """The failures in a row of the first wanted event after ``cursor`` (None: none read)."""
        for slot in self._slots:
            if slot.event.id > cursor and slot.status not in _DEALT:
                return slot.failures
        return None


Job = tuple[Callable[[Any], Any], "queue.SimpleQueue[tuple[Slot, Any]]", Slot]


class Senders:
    """Threads that run one job each at a time (a POST), each with a context of its own (its
    ``Poster``), made by ``make`` on that thread; up to ``size`` of them, started as needed.
    ``size`` may change between deliveries (each webhook's window): threads beyond a smaller one
    end at once if idle, else as their job ends, so a narrower webhook's POSTs, one after another,
    do not go round the wider one's threads (each poster a connection kept to its receiver, and
    none of them ever idle long enough to end)."""

    def __init__(self, make: Callable[[], Any], size: int = WINDOW) -> None:
        self._make = make
        self._size = size
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()  # (None: end)
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # idle threads less the jobs not yet taken (below 0: jobs wait)

    @property
    def size(self) -> int:
        return self._size

    @size.setter
    def size(self, size: int) -> None:
        """Resize; the idle threads beyond it are told to end (each as a job would be taken)."""
        with self._lock:
            self._size = size
            extra = max(0, min(self._idle, self._threads - size))
            self._idle -= extra
            self._threads -= extra  # (counted out now: no other thread ends in their place)
        for _ in range(extra):
            self._jobs.put(None)

    def submit(self, job: Callable[[Any], Any], answers: queue.SimpleQueue[tuple[Slot, Any]],
               slot: Slot) -> None:  # fmt: skip
        """Run ``job(context)`` on a sender; ``(slot, its result)`` goes to ``answers``."""
        with self._lock:
            start = self._idle == 0 and self._threads < self._size
            if start:
                self._threads += 1
            else:
                self._idle -= 1  # (taken by this job: the next one starts a thread if none is)
        self._jobs.put((job, answers, slot))
        if start:
            threading.Thread(target=self._main, name="webhook-sender", daemon=True).start()

    def _main(self) -> None:
        context: Any = None
        try:
            while True:
                try:
                    got = self._jobs.get(timeout=IDLE_END)
                except queue.Empty:
                    with self._lock:
                        if self._idle > 0:  # (no job is on its way to this thread)
                            self._idle -= 1
                            self._threads -= 1
                            return
                    continue
                if got is None:  # beyond a smaller size (counted out by ``size``)
                    return
                job, answers, slot = got
                try:
                    if context is None:
                        context = self._make()
                    result: Any = job(context)
                except Exception as exc:  # told as the POST's failure
                    result = f"{type(exc).__name__}: {exc}"
                answers.put((slot, result))
                with self._lock:
                    if self._threads > self._size and self._idle >= 0:  # (no job waits for it)
                        self._threads -= 1
                        return
                    self._idle += 1
        except BaseException:
            with self._lock:
                self._threads -= 1
            raise
        finally:
            close = getattr(context, "close", None)  # (a poster's kept connections)
            if close is not None:
                close()
