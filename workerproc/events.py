"""What a worker's threads tell its conductor: typed events in one inbox.

The heartbeat thread, the alarms it raises and the executors that run handlers never call into
each other nor into the worker: each reports what happened as an event (``post``), and the
conductor (``worker.py``), the one owner of the worker's state (what it claims, its slots'
endings, its drain, its exit code), takes every event at the top of each turn and reacts to
them in one place (``Worker._react``).

A few reactions cannot wait for the conductor's next turn, because the conductor may be the
very thread that is stuck (an inline handler runs on it) or busy for long (an exchange retried
while the database is locked): interrupting a handler whose lease is lost or whose run was
cancelled, judging a task timeout, ending a process whose handler ignores ``LeaseLost``, and
freeing a slot the moment its handler ended (a slot thread starts the next prefetched task
itself, without a conductor turn). So ``Inbox.post`` first runs the worker's ``reflex`` on the
posting thread (``Worker._on_the_spot``: the alarms for the heartbeat's reports, the holdings for
an ending), and the reflex may answer with a ``Reaction``: what the poster itself does next, with
what only it holds (the heartbeat thread's own connection: no connection crosses a thread).
Then the event is queued for the conductor, which is woken on the first event since it last
took them (a batch of endings costs one wake-up, as a batch of endings always did); its own
posts (an inline handler's ending, a takeover of its own older attempt) wake nothing: it is
awake, and takes every event before it waits.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .signals import Waker
from .store import Commit, Lease

if TYPE_CHECKING:
    from .execution import Execution


@dataclass(frozen=True, slots=True)
class TaskFinished:
    """A handler ended (on its executor's thread); ``execution.commit`` is its last word."""

    execution: Execution


@dataclass(frozen=True, slots=True)
class LeaseLost:
    """The heartbeat lost ``lease``: a renewal refused, its local deadline passed while the
    database was busy, or this worker's own claim took its task over (then posted from the
    conductor's thread, in ``Heartbeat.track``)."""

    lease: Lease
    why: str


@dataclass(frozen=True, slots=True)
class RunCancelled:
    """A renewal answered that ``lease``'s run was cancelled under it (B15)."""

    lease: Lease


@dataclass(frozen=True, slots=True)
class TaskTimedOut:
    """``lease``'s handler outlived its task timeout; the heartbeat stopped renewing it."""

    lease: Lease


@dataclass(frozen=True, slots=True)
class HandlerStuck:
    """``lease`` was lost a whole ttl ago and its handler still runs: it ignores ``LeaseLost``."""

    lease: Lease


@dataclass(frozen=True, slots=True)
class HeartbeatDied:
    """The heartbeat thread ended on ``error``: no lease of the worker is renewed any more."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class DrainAsked:
    """Stop claiming and exit with ``code`` once the running tasks finished: a timeout cost the
    worker a slot (a thread that cannot be stopped, an event loop a handler blocks)."""

    code: int
    why: str


@dataclass(frozen=True, slots=True)
class SlowBehind:
    """The leases prefetched behind a slow inline handler went back unstarted (``count``): the
    adaptive prefetch is earned again from scratch."""

    count: int


Event = (
    TaskFinished
    | LeaseLost
    | RunCancelled
    | TaskTimedOut
    | HandlerStuck
    | HeartbeatDied
    | DrainAsked
    | SlowBehind
)


@dataclass(frozen=True, slots=True)
class Reaction:
    """What the posting thread does itself after its report (the heartbeat's, in this order):
    write ``write`` on its own connection (fenced: a no-op for a lease whose commit came first),
    stop renewing ``forget``, exit the process with ``exit``, post ``then`` (once the writes
    landed). ``postpone``: a timeout that is not its handler's fault yet, looked at again soon."""

    write: tuple[Commit, ...] = ()
    forget: tuple[Lease, ...] = ()
    exit: int | None = None
    then: Event | None = None
    postpone: bool = False
    what: str = "the alarm's writes"  # the log line when the write fails: what it was,
    failed: str = "timeout_release_failed"  # its event,
    level: int = logging.ERROR  # and its level


Post = Callable[[Event], Reaction | None]  # how a part reports (``Inbox.post``)
Reflex = Callable[[Event], Reaction | None]  # what must happen on the posting thread


class Inbox:
    """The conductor's queue of events: any thread posts, the conductor takes them all at once.
    Unbounded in count but not in kind: each event stands for a lease or a handler the worker
    holds (at most its slots and its prefetch), or for an alarm that ends the worker."""

    def __init__(self, waker: Waker, reflex: Reflex | None = None) -> None:
        self._conductor = threading.get_ident()  # the thread that takes: built by it
        self._waker = waker
        self._reflex = reflex
        self._lock = threading.Lock()
        self._events: deque[Event] = deque()

    def post(self, event: Event) -> Reaction | None:
        """Report ``event`` (any thread): the reflex runs here and now, then the conductor hears
        of it at its next turn (woken for the first event since it last took them)."""
        reaction = self._reflex(event) if self._reflex is not None else None
        with self._lock:
            first = not self._events
            self._events.append(event)
        if first and threading.get_ident() != self._conductor:
            self._waker.wake()
        return reaction

    def take(self) -> list[Event]:
        """Every event posted since the last take, in order (the conductor's thread)."""
        with self._lock:
            events = list(self._events)
            self._events.clear()
        return events

    def __bool__(self) -> bool:
        """Whether an event waits to be taken."""
        return bool(self._events)

    def __len__(self) -> int:
        return len(self._events)
