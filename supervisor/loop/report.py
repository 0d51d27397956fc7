"""The loop's steps that report rather than act on workers: ``--drain``'s check of the served
queues (its progress line, and the stop once they are empty), and the state file that
``status``, ``scale`` and ``health`` read."""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from typing import Any

from workerproc.store import StoreError, redact
from workerproc.store.webhooks import WEBHOOK_QUEUE

from ..logs import drain_progress, event
from .arbiter import Arbiter
from .failures import failed_in_drain

WARN = logging.WARNING


def stop_when_drained(arb: Arbiter) -> None:
    """--drain: stop once no task of the served queues (--queues; all by default) is ready,
    delayed or leased. The webhooks' delivery runs never end (B20): of their queue only a
    delivery in flight (leased, or its lease expired) is waited for, so a drain under chaos
    sees a delivery it paused taken over before it stops."""
    if not arb.config.drain or arb.stopping:
        return
    if not arb.due("drain", arb.config.timing.drain_check):
        return
    served = arb.config.worker.queues
    try:
        with arb.gate.session() as store:
            # One index lookup per queue says whether any work is left (a run's ready_at is
            # NULL only when it is over or has no pending task); the full counts, a scan of
            # every run, only for the progress line and the final message.
            left = store.next_ready_at(served) is not None
            if left and (served is None or WEBHOOK_QUEUE in served) and store.webhooks():
                left = False  # that may be only the deliveries: the counts below tell
            if left and (arb.progress is None or not arb.progress.enabled):
                return
            stats = store.stats()
    except StoreError as exc:
        event("drain_check_failed", f"drain check failed: {exc}", level=WARN)
        return
    mine = [c for q, c in stats.queues.items()
            if q != WEBHOOK_QUEUE and (served is None or q in served)]  # fmt: skip
    runs: Counter[str] = Counter()
    for c in mine:
        runs.update(c.runs)
    done = sum(runs.get(s, 0) for s in ("succeeded", "failed", "cancelled"))
    if arb.progress is not None:
        progress = drain_progress(done, sum(runs.values()), runs.get("failed", 0), arb.started_at)
        arb.progress.show(progress)
    deliveries = stats.queues.get(WEBHOOK_QUEUE)
    in_flight = deliveries.leased + deliveries.expired if deliveries is not None else 0
    if served is not None and WEBHOOK_QUEUE not in served:
        in_flight = 0  # not ours to deliver
    if in_flight == 0 and sum(c.ready + c.delayed + c.leased + c.expired for c in mine) == 0:
        if arb.progress is not None:
            arb.progress.finish()
        try:
            with arb.gate.session() as store:
                failed = failed_in_drain(arb, store)
        except StoreError as exc:
            event("drain_check_failed", f"drain check failed: {exc}", level=WARN)
            return
        event(
            "drain_finished",
            f"drain finished: no task ready, delayed or leased ({done} runs done, "
            f"{runs.get('failed', 0)} failed, {failed} of them during this drain)",
            runs=dict(runs),
            failed_in_drain=failed,
        )
        arb.stop("drain finished")


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
        "db": redact(arb.config.worker.db),
        "app": arb.config.worker.app,
        "workers": workers,
        **arb.extra_state,
        "reload": arb.reloads.snapshot(arb),
    }
