"""A child process whose waits sleep on descriptors numbered 1024 or more (``select`` refuses
those): it raises its soft ``RLIMIT_NOFILE``, fills every lower number with ``/dev/null``, then
makes the waiter (whose pipes, watches and sockets therefore get high numbers) and reports, one
JSON line per step, how long each wait took and what woke it. A line ``ready`` asks the parent
for a signal (``SIGTERM``) and the step then waits for it.

    python high_fds.py waker | inbox | background | dialect | postgres URL

tests/process/test_high_descriptors.py runs it.
"""

from __future__ import annotations

import json
import os
import queue
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from supervisor.loop.signals import SignalInbox
from workerproc.background import StoreThread
from workerproc.outage import Outage
from workerproc.signals import Signals, Waker
from workerproc.store import WorkerStore, open_store

HIGH = 1024  # FD_SETSIZE: select() refuses this number and above
FILL_TO = 1100  # the first number a waiter gets
WANT_LIMIT = 2048
TIMEOUT = 0.4  # a wait that nothing wakes
LONG = 30.0  # a wait that something must wake long before its end


def raise_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < WANT_LIMIT:
        top = WANT_LIMIT if hard == resource.RLIM_INFINITY else min(WANT_LIMIT, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))


def fill() -> list[int]:
    """Take every free descriptor number below ``FILL_TO``: the next ones opened are higher."""
    held = []
    while (fd := os.open(os.devnull, os.O_RDONLY)) < FILL_TO:
        held.append(fd)
    os.close(fd)
    return held


def report(step: str, **what: Any) -> None:
    print(json.dumps({"step": step, **what}), flush=True)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    began = time.monotonic()
    out = fn()
    return time.monotonic() - began, out


def later(seconds: float, fn: Callable[[], Any]) -> threading.Timer:
    timer = threading.Timer(seconds, fn)
    timer.start()
    return timer


def ask_for_signal() -> None:
    print("ready", flush=True)


def waker() -> None:
    """The worker's conductor wait: its self-pipe (written by signal handlers and by threads)
    and the store's change watch beside it (``also``)."""
    wake, signals = Waker(), Signals()
    signals.install(wake)
    r, w = os.pipe()
    report("fds", fds=[wake.rfd, wake.wfd, r])
    took, seen = timed(lambda: wake.wait(TIMEOUT, also=r))
    report("timeout", took=took, seen=sorted(seen))
    later(0.2, wake.wake)
    took, seen = timed(lambda: wake.wait(LONG, also=r))
    report("woken", took=took, seen=sorted(seen))
    later(0.2, lambda: os.write(w, b"x"))
    took, seen = timed(lambda: wake.wait(LONG, also=r))
    report("also", took=took, readable=os.read(r, 1) == b"x")
    ask_for_signal()
    took, seen = timed(lambda: wake.wait(LONG, also=r))
    report("signal", took=took, seen=sorted(seen))


def inbox() -> None:
    """The supervisor's loop wait: its self-pipe and the extra descriptors (metrics, probes)."""
    box = SignalInbox()
    box.install()
    r, w = os.pipe()
    box.extra_fds.add(r)
    report("fds", fds=[*box.fds, r])
    took, _ = timed(lambda: box.wait(TIMEOUT))
    report("timeout", took=took)
    later(0.2, lambda: os.write(w, b"x"))
    took, _ = timed(lambda: box.wait(LONG))
    report("also", took=took, readable=os.read(r, 1) == b"x")
    box.extra_fds.discard(r)
    ask_for_signal()
    took, _ = timed(lambda: box.wait(LONG))
    report("signal", took=took, queue=box.pop_all())


class Counted:
    """Counts the reads of a change token (a waiter that spins reads it thousands of times)."""

    def __init__(self, fn: Callable[..., int]) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, *args: Any) -> int:
        self.calls += 1
        return self.fn(*args)


def background() -> None:
    """A worker's background thread (the webhooks' waker, the schedules' firer) asleep in
    ``StoreThread.wait_change``: the store's change watch and its own stop pipe."""
    path = os.path.join(tempfile.mkdtemp(), "bg.db")
    open_store(path).close()
    steps = [("timeout", TIMEOUT * 3), ("commit", LONG), ("close", LONG)]
    entered: queue.Queue[str] = queue.Queue()
    done: queue.Queue[str] = queue.Queue()

    def opened() -> WorkerStore:
        store = open_store(path)
        store.change_token = Counted(store.change_token)  # type: ignore[method-assign]
        return store

    class Waiter(StoreThread):
        def turn(self, store: WorkerStore) -> None:
            if not steps:
                self.sleep(LONG)
                return
            step, seconds = steps.pop(0)
            watch = store.change_watch()
            report("fds", fds=[self._waker.rfd, -1 if watch is None else watch.fileno()])
            reads = store.change_token  # (the Counted)
            token = store.change_token()
            before = reads.calls  # type: ignore[attr-defined]
            entered.put(step)
            took, moved = timed(lambda: self.wait_change(store, token, seconds))
            report(step, took=took, moved=moved, reads=reads.calls - before)  # type: ignore[attr-defined]
            done.put(step)

    order = [step for step, _ in steps]  # (before the thread starts: it pops them as it goes)
    thread = Waiter(opened, Outage())
    thread.start()
    for step in order:
        assert entered.get(timeout=LONG) == step
        if step == "commit":
            time.sleep(0.2)
            writer = open_store(path)
            writer.start_run("t")
            writer.close()
        elif step == "close":
            time.sleep(0.2)
            took, _ = timed(thread.close)
            report("closed", took=took)
        assert done.get(timeout=LONG) == step


def dialect() -> None:
    """The store's own ``wait_change`` (SQLite: on the inotify watch of the database)."""
    path = os.path.join(tempfile.mkdtemp(), "d.db")
    store = open_store(path)
    watch = store.change_watch()
    report("fds", fds=[-1 if watch is None else watch.fileno()])
    engine = store.dialect  # type: ignore[attr-defined]
    engine.change_token = counted = Counted(engine.change_token)
    token = store.change_token()
    took, now = timed(lambda: store.wait_change(token, TIMEOUT * 3))
    report("timeout", took=took, moved=now != token, reads=counted.calls)

    def commit() -> None:
        writer = open_store(path)
        writer.start_run("t")
        writer.close()

    later(0.2, commit)
    took, now = timed(lambda: store.wait_change(token, LONG))
    report("commit", took=took, moved=now != token)


def postgres(url: str) -> None:
    """The PostgreSQL store's LISTEN connection: its token, its wait on a notification, the
    UNLISTEN a claim sends and the LISTEN of the next idle spell."""
    store, writer = open_store(url), open_store(url)
    token = store.change_token()  # (opens the listening connection: a high number)
    watch = store.change_watch()
    report("fds", fds=[] if watch is None else [watch.fileno()])
    took, now = timed(lambda: store.wait_change(token, TIMEOUT * 2))
    report("timeout", took=took, moved=now != token)
    later(0.2, lambda: writer.start_run("t"))
    took, now = timed(lambda: store.wait_change(token, LONG))
    report("notified", took=took, moved=now != token)
    lease = store.claim("w", 60)  # found work: UNLISTEN, fire and forget
    report("claimed", leased=lease is not None)
    token = store.change_token()  # the next idle spell: LISTEN again
    later(0.2, lambda: writer.start_run("t"))
    took, now = timed(lambda: store.wait_change(token, LONG))
    report("notified_again", took=took, moved=now != token)
    store.close()
    writer.close()


def main() -> None:
    raise_limit()
    held = fill()
    what = sys.argv[1]
    try:
        if what == "postgres":
            postgres(sys.argv[2])
        else:
            {"waker": waker, "inbox": inbox, "background": background, "dialect": dialect}[what]()
    finally:
        for fd in held:
            os.close(fd)


if __name__ == "__main__":
    main()
