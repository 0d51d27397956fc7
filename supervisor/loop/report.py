"""The loop's steps that report rather than act on workers: ``--drain``'s check of the served
queues (its progress line, and the stop once they are empty), and the state file that
``status``, ``scale`` and ``health`` read."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from workerproc.store import Inspector, QueueCounts, Stats, StoreError, redact_url, watch_file
from workerproc.store.dialect import SETTLE
from workerproc.store.webhooks import BACKLOG_MAX, WEBHOOK_QUEUE, WebhookInfo

from ..logs import drain_progress, event
from .arbiter import Arbiter
from .failures import failed_in_drain

WARN = logging.WARNING


UNSERVED_LOOK = 1000  # pending runs a drain looks at for tasks no worker serves
UNSERVED_EVERY = 1.0  # seconds between those looks
# seconds: after a commit the drain takes a quick look (is any task of the served queues left?)
# this soon, not at its next drain_check; no more often than this however busy the database is
# (a commit is only a hint: the look decides). A look is one index lookup per queue on the kept
# store (``StoreGate.kept``: tens of microseconds), so a busy drain pays under 1 % of a core
# for them, and a drain's last commit is seen within this.
DRAIN_SOONEST = 0.005


def watch_drain(arb: Arbiter) -> Callable[[], None]:
    """--drain on SQLite: wake the loop at a commit (the database's inotify watch), so the
    drain's end is seen as its last run commits, not at the next ``drain_check``; answer what
    closes the watch in a forked child. Without a watch (PostgreSQL, no inotify) the drain
    checks every ``drain_check`` as before."""
    watch = watch_file(arb.config.worker.db) if arb.config.drain else None
    if watch is None:
        return lambda: None
    arb.drain_watch = watch
    arb.inbox.extra_fds.add(watch.fileno())

    def close_in_child() -> None:
        if arb.drain_watch is watch:  # (the parent's: ``watch.close`` leaves it to its process)
            with contextlib.suppress(OSError):
                os.close(watch.fileno())

    return close_in_child


def _drain_look(arb: Arbiter) -> str | None:
    """How the drain looks now: "full" every ``drain_check`` (as without a watch), "quick"
    ``DRAIN_SOONEST`` after a commit at most, and again every ``DRAIN_SOONEST`` for ``SETTLE``
    after it (the watch sees the write-ahead log written, not the commit marked done in shared
    memory: a look at once may miss a commit no later write announces); None: not now. A
    commit wakes the loop once: the watch is quiet from then to the next look, so a busy
    database costs the loop a turn or two per look, not one per commit."""
    watch = arb.drain_watch
    if watch is not None and watch.drain():
        arb.drain_changed = True
        arb.drain_settling = arb.clock() + SETTLE
        arb.inbox.extra_fds.discard(watch.fileno())
    settling = arb.clock() < arb.drain_settling
    if arb.due("drain", arb.config.timing.drain_check):
        look = "full"
    elif (arb.drain_changed or settling) and arb.due("drain-soon", DRAIN_SOONEST):
        look = "quick"
    else:
        return None
    arb.drain_changed = False
    if watch is not None:
        arb.inbox.extra_fds.add(watch.fileno())
    return look


def unwatch_drain(arb: Arbiter) -> None:
    """The drain is over (stopping): its watch no longer wakes the loop."""
    watch, arb.drain_watch = arb.drain_watch, None
    if watch is not None:
        arb.inbox.extra_fds.discard(watch.fileno())
        watch.close()


def stop_when_drained(arb: Arbiter) -> None:
    """--drain: stop once no task of the served queues (--queues; all by default) is ready,
    delayed or leased, and every webhook has delivered what it can (B20, ``WebhookInfo.settled``):
    caught up, or failing (named in the last line, with its backlog and its next try). The
    delivery runs never end, so of their queue the drain waits for a webhook with events to
    deliver (its delivery due, or parked until its waker wakes it) and for a delivery in flight
    (leased, or its lease expired: a drain under chaos sees a delivery it paused taken over),
    unless its webhook is failing: one trying again at once, always in flight, is not waited
    out."""
    if arb.stopping:
        unwatch_drain(arb)
    look = None if not arb.config.drain or arb.stopping else _drain_look(arb)
    if look is None:
        return
    served = arb.config.worker.queues
    delivering = served is None or WEBHOOK_QUEUE in served
    hooks: list[WebhookInfo] = []
    now = 0.0
    try:
        with arb.gate.kept() as store:
            # One index lookup per queue says whether any work is left (a run's ready_at is
            # NULL only when it is over or has no pending task); the full counts, a scan of
            # every run, only for the progress line and the final message.
            left = store.next_ready_at(served) is not None
            if left and look == "quick":
                return  # work is left: the full look (its progress, webhooks) keeps its pace
            if left and delivering and store.webhook_list():
                left = False  # that may be only the deliveries: the counts below tell
            # what is left may be only runs no worker of this pool serves (B22): looked for
            # once a second at most, so a drain of a long queue pays next to nothing for it
            seek = left and arb.due("unserved", UNSERVED_EVERY)
            unserved = _unserved(store, served, arb.app.served_tasks()) if seek else {}
            if left and not unserved and (arb.progress is None or not arb.progress.enabled):
                return
            stats = store.stats()
            if delivering and _queues_done(stats, served, len(unserved)):  # (webhooks' turn)
                hooks, now = store.webhooks(), store.now()
                if not all(h.settled() for h in hooks):
                    return
    except StoreError as exc:
        event("drain_check_failed", f"drain check failed: {exc}", level=WARN)
        return
    mine = _mine(stats, served)
    runs: Counter[str] = Counter()
    for c in mine:
        runs.update(c.runs)
    done = sum(runs.get(s, 0) for s in ("succeeded", "failed", "cancelled"))
    if arb.progress is not None:
        progress = drain_progress(done, sum(runs.values()), runs.get("failed", 0), arb.started_at)
        arb.progress.show(progress)
    if _queues_done(stats, served, len(unserved)):
        if arb.progress is not None:
            arb.progress.finish()
        try:
            with arb.gate.session() as store:
                failed = failed_in_drain(arb, store)
        except StoreError as exc:
            event("drain_check_failed", f"drain check failed: {exc}", level=WARN)
            return
        behind = [h for h in hooks if h.backlog]
        event(
            "drain_finished",
            f"drain finished: no task ready, delayed or leased ({done} runs done, "
            f"{runs.get('failed', 0)} failed, {failed} of them during this drain)"
            + "".join(f"; {_behind(h, now)}" for h in behind)
            + _waiting(unserved),
            runs=dict(runs),
            unserved=len(unserved),
            failed_in_drain=failed,
            webhooks_behind={h.name: h.backlog for h in behind},
        )
        arb.stop("drain finished")


def _mine(stats: Stats, served: tuple[str, ...] | None) -> list[QueueCounts]:
    """The served queues' counts, the deliveries' left out (their runs never end)."""
    return [c for q, c in stats.queues.items()
            if q != WEBHOOK_QUEUE and (served is None or q in served)]  # fmt: skip


def _queues_done(stats: Stats, served: tuple[str, ...] | None, unserved: int = 0) -> bool:
    """No task of the served queues is ready, delayed or leased but the ``unserved`` ones
    (ready, for a task no worker of the pool serves: B22), the deliveries' left to the
    webhooks to judge (``WebhookInfo.settled``)."""
    left = sum(c.ready + c.delayed + c.leased + c.expired for c in _mine(stats, served))
    return left <= unserved


def _unserved(
    store: Inspector, served: tuple[str, ...] | None, tasks: tuple[str, ...]
) -> dict[int, str]:
    """The pending runs of the served queues whose next task is none of the pool's ``tasks``
    (B22): no worker of this pool claims them, so a drain does not wait for them, and says
    so. Only looked for among the newest ``UNSERVED_LOOK`` pending runs: with more, the drain
    goes on as if they were served."""
    pending = store.pending_ids(UNSERVED_LOOK, queues=served)  # (the deliveries are the system's)
    return store.unserved(pending, tasks=tasks) if pending else {}


def _waiting(unserved: dict[int, str]) -> str:
    """What a drain leaves behind: the runs that wait for a worker that serves their task."""
    if not unserved:
        return ""
    reasons = sorted(set(unserved.values()))
    more = f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
    count = len(unserved)
    return f"; {count} run{'s' if count > 1 else ''} left waiting: {reasons[0]}{more}"


def _behind(hook: WebhookInfo, now: float) -> str:
    """A webhook still behind as a drain ends: its backlog, and why it is not delivered."""
    more = "+" if hook.backlog >= BACKLOG_MAX else ""
    text = f"webhook {hook.name} behind by {hook.backlog}{more} events"
    if hook.status == "missing":  # (pruned by a version whose prune did not keep it)
        return (f"{text}, its delivery run is gone: supervisor webhooks remove {hook.name}, "
                f"then add it again with --after {hook.cursor}")  # fmt: skip
    if hook.status in ("failed", "cancelled"):
        return f"{text}, its delivery run {hook.status} (supervisor retry {hook.run_id})"
    if hook.failures:
        if hook.next_try_at is not None and hook.next_try_at > now:
            when = f"in {hook.next_try_at - now:.0f} s"
        else:
            when = "now"  # (due, or in flight: trying again at once)
        failed = f"{hook.failures} failure{'s' if hook.failures > 1 else ''} in a row"
        return f"{text}, next try {when} ({failed})"
    return f"{text}, its delivery run {hook.status}"


def publish_state(arb: Arbiter) -> None:
    arb.events.emit("tick")
    if arb.pidfile is None:
        return
    if not arb.state_dirty and not arb.due("state", arb.config.timing.state_every):
        return
    arb.state_dirty = False
    arb.last_run["state"] = arb.clock()
    arb.pidfile.write_state(snapshot(arb))


def snapshot(arb: Arbiter) -> dict[str, Any]:
    """What ``status``, ``scale`` and ``health`` read from the state file."""
    offset = time.time() - arb.clock()  # monotonic -> wall clock
    workers = []
    for w in sorted(arb.pool.workers.values(), key=lambda w: w.slot):
        slot = arb.board.read(w.slot)
        mine = slot is not None and slot.pid == w.pid
        workers.append(
            {
                "pid": w.pid,
                "index": w.slot,
                "owner": w.owner,
                "generation": w.generation,
                "started_at": round(w.started_at + offset, 3),
                "retiring": w.retiring,
                "phase": slot.phase_name if mine and slot else "starting",
                "busy": slot.busy if mine and slot else 0,
                "task_id": slot.task_id if mine and slot and slot.task_id else None,
                "attempt": slot.attempt if mine and slot and slot.attempt else None,
            }
        )
    return {
        "pid": os.getpid(),
        "tick": round(time.time(), 3),
        "phase": str(arb.phase),
        "target": arb.pool.target,
        "concurrency": arb.config.worker.concurrency,
        "generation": arb.pool.generation,
        "db": redact_url(arb.config.worker.db),
        "app": arb.config.worker.app,
        "workers": workers,
        **arb.extra_state,
        "reload": arb.reloads.snapshot(arb),
    }
