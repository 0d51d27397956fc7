"""The steps of the main loop, in order. Each is a plain function of the arbiter: it looks at the
state, acts, and asks to be woken (``arbiter.wake_at``) when it has something due."""

from __future__ import annotations

import logging
import signal
from typing import Any

import psutil

from workerproc import exitcodes as wexit
from workerproc.status import HANDLER
from workerproc.store import StoreError

from .. import exitcodes
from ..errors import SupervisorError
from ..logs import event
from .arbiter import Arbiter, Phase, Step
from .guard import stop_corrupt
from .pool import Exit, ExitKind, WorkerProcess
from .report import publish_state, stop_when_drained
from .signals import name as signal_name

WARN = logging.WARNING


def handle_signals(arb: Arbiter) -> None:
    """Act on every action signal recorded since the last turn, in arrival order (SIGCHLD is
    only a flag that woke the loop: the reap step runs on every turn anyway)."""
    hup = False
    for signum in arb.inbox.pop_all():
        event("signal", f"received {signal_name(signum)}", signal=signal_name(signum))
        if signum in (signal.SIGTERM, signal.SIGINT):
            if arb.stopping:
                arb.fast_stop(f"second {signal_name(signum)}")
            else:
                arb.stop(signal_name(signum))
        elif signum == signal.SIGQUIT:
            arb.fast_stop("SIGQUIT")
        elif signum == signal.SIGHUP:
            hup = True  # several HUPs read together are one reload
        elif signum == signal.SIGTTIN:
            arb.scale(+1)
        elif signum == signal.SIGTTOU:
            arb.scale(-1)
    if hup:
        arb.reload()


def reap(arb: Arbiter) -> None:
    exits = arb.pool.reap()
    held = _settle_leases(arb, exits) if exits else {}
    for reaped in exits:
        arb.state_dirty = True
        leases = held.get(reaped.worker.owner)
        ex = arb.pool.as_crash(reaped) if leases and _clean(reaped) else reaped
        level = logging.INFO if ex.kind is not ExitKind.CRASHED else WARN
        fields: dict[str, Any] = {
            "worker": ex.worker.pid,
            "index": ex.worker.slot,
            "kind": str(ex.kind),
        }
        fields.update(code=ex.code, signal=signal_name(ex.signal) if ex.signal else None)
        holding = f" holding {leases} lease(s)" if leases else ""
        if leases:
            fields["leases"] = leases
        event("worker_exited", f"{ex.describe()}{holding}: {ex.kind}", level=level, **fields)
        arb.events.emit("worker_exited", exit=ex)  # subscribers may read its slot (metrics)
        arb.board.slot(ex.worker.slot).clear()
        if ex.backoff:
            event(
                "restart_backoff",
                f"{arb.pool.crash_streak} workers died within "
                f"{arb.config.timing.crash_window:g}s of starting: next start in {ex.backoff:.1f}s",
                level=WARN,
                streak=arb.pool.crash_streak,
                backoff=round(ex.backoff, 3),
            )
        if ex.code == wexit.STORE_CORRUPT:
            stop_corrupt(arb, f"worker {ex.worker.pid}", "it met a malformed database")
        failed_reload = arb.reloads.worker_exited(arb, ex)
        if ex.kind is ExitKind.BOOT_FAILURE and not failed_reload:
            event(
                "boot_failure",
                f"worker {ex.worker.pid} could not boot (exit code {wexit.BOOT_FAILURE}; its log "
                "says why): stopping the supervisor",
                level=logging.ERROR,
            )
            arb.stop("a worker could not boot", exitcodes.WORKER_BOOT)
    if arb.pending_release and not exits:  # retry earlier failures (_settle_leases did, else)
        release(arb)


def _clean(ex: Exit) -> bool:
    """It exited by itself with a code that says "all done" (0, recycled, retired on request).
    One that still held a lease left work behind: that is a crash, whatever its code says."""
    return ex.signal is None and ex.kind not in (ExitKind.CRASHED, ExitKind.BOOT_FAILURE)


def _settle_leases(arb: Arbiter, exits: list[Exit]) -> dict[str, int]:
    """How many leases each reaped worker still held, from the database (never from its exit
    code: a worker that called ``os._exit(0)`` in a handler held one). With fast release (or a
    worker we killed) they are released now; with ``--no-fast-release`` they are only counted
    and left to expire, which is what that switch exists to prove. Unknown owners (the database
    did not answer) are missing from the answer; their release is retried."""
    give_up = arb.clock() + arb.config.worker.lease_ttl
    counted: list[str] = []
    for ex in exits:
        if arb.config.fast_release or ex.worker.killed:
            arb.pending_release[ex.worker.owner] = give_up
        else:
            counted.append(ex.worker.owner)
    held = release(arb)
    if counted:
        try:
            held.update(arb.gate.lease_counts(counted))
        except StoreError as exc:
            event("lease_count_failed", f"cannot count a dead worker's leases: {exc}", level=WARN)
    return held


def release(arb: Arbiter) -> dict[str, int]:
    """Fast release: expire the leases of reaped workers at once (they are known dead).
    Returns how many each owner held (empty when the database did not answer)."""
    owners = list(arb.pending_release)
    if not owners:
        return {}
    try:
        released = arb.gate.release_owners(owners)
    except StoreError as exc:
        now = arb.clock()
        for owner, give_up in list(arb.pending_release.items()):
            if now >= give_up:  # the ttl has expired them by now anyway
                del arb.pending_release[owner]
        event("release_failed", f"could not release leases, will retry: {exc}", level=WARN)
        arb.wake_at(now + 0.5)
        return {}
    for owner, count in released.items():
        arb.pending_release.pop(owner, None)
        if count:
            arb.events.emit("leases_released", owner=owner, count=count)
            event(
                "leases_released",
                f"released {count} lease(s) of dead worker {owner}",
                owner=owner,
                count=count,
            )
    return released


def enforce_deadlines(arb: Arbiter) -> None:
    grace = arb.config.worker.graceful_timeout
    for worker in arb.pool.overdue(grace):
        event(
            "worker_killed",
            f"worker {worker.pid} did not stop within {grace:g}s ({worker.retiring}): SIGKILL",
            level=WARN,
            worker=worker.pid,
        )
        arb.pool.kill_now(worker, "graceful timeout")
    for worker in arb.pool.workers.values():
        if worker.term_sent_at is not None and not worker.killed:
            arb.wake_at(worker.term_sent_at + grace + 0.001)


def check_memory(arb: Arbiter) -> None:
    limit = arb.config.max_worker_memory
    if limit is None or arb.stopping or not arb.due("memory", arb.config.timing.memory_check):
        return
    for worker in arb.pool.active():
        try:
            rss = psutil.Process(worker.pid).memory_info().rss
        except psutil.Error:
            continue  # gone: the reap step will see it
        if rss > limit * 1024 * 1024:
            event(
                "worker_recycle_memory",
                f"worker {worker.pid} uses {rss / 1048576:.0f} MB > {limit:g} MB: "
                "recycling it after its current task",
                worker=worker.pid,
                rss_mb=round(rss / 1048576, 1),
            )
            arb.pool.retire(worker, "memory")


def reload_probe(arb: Arbiter) -> None:
    arb.reloads.step(arb)


def roll(arb: Arbiter) -> None:
    """HUP: add one new-generation worker, wait until it is up, retire one old; repeat."""
    if not arb.rolling or arb.stopping:
        return
    pool = arb.pool
    generation = pool.generation
    fresh = [w for w in pool.active() if w.generation == generation]
    old = [w for w in pool.active() if w.generation != generation]
    starting = [w for w in fresh if not arb.is_up(w)]
    limit = arb.config.timing.reload_boot_timeout
    for worker in starting:
        if arb.clock() - worker.started_at > limit:
            why = f"worker {worker.pid} of generation {generation} did not claim within {limit:g}s"
            arb.reloads.fail(arb, why)
            return
    if starting:
        arb.wake_at(arb.clock() + 0.05)
        return
    if not old and len(fresh) >= pool.target:
        arb.reloads.finish(arb)
        return
    if len(pool.active()) <= pool.target:
        wait = pool.backoff_remaining()  # a new app that crashes at boot must not spin
        if wait > 0:
            arb.wake_at(arb.clock() + wait)
            return
        _spawn(arb)
        arb.wake_at(arb.clock() + 0.05)
        return
    pool.retire(_pick_to_retire(arb, old), "reload")
    arb.wake_at(arb.clock() + 0.05)


def maintain(arb: Arbiter) -> None:
    """Keep ``target`` active workers: spawn the missing (crash-loop backoff), retire extras."""
    if arb.stopping:
        return
    pool = arb.pool
    while len(pool.active()) < pool.target:
        wait = pool.backoff_remaining()
        if wait > 0:
            arb.wake_at(arb.clock() + wait)
            break
        if _spawn(arb) is None:
            break
    extra = len(pool.active()) - pool.target
    if extra > 0 and not arb.rolling:
        for _ in range(extra):
            pool.retire(_pick_to_retire(arb, pool.active()), "scale down")
    if not arb.ready_announced:
        up = [w for w in pool.active() if arb.is_up(w)]
        if len(up) >= pool.target:
            arb.ready_announced = True
            event("ready", f"all {pool.target} workers are up", workers=pool.target)
            arb.events.emit("ready", reload=False)
        else:
            arb.wake_at(arb.clock() + 0.05)


def _spawn(arb: Arbiter) -> WorkerProcess | None:
    try:
        worker = arb.pool.spawn(arb.config.max_tasks_for_new_worker(arb.rng))
    except (OSError, SupervisorError) as exc:
        delay = arb.pool.spawn_failed()
        event(
            "spawn_failed",
            f"cannot start a worker: {exc}; next try in {delay:.1f}s",
            level=logging.ERROR,
        )
        arb.wake_at(arb.clock() + delay)
        return None
    if worker is None:
        event("no_slot", "the status board is full: cannot start more workers", level=WARN)
        return None
    arb.state_dirty = True
    event(
        "worker_started",
        f"worker {worker.pid} started (index {worker.slot}, generation {worker.generation})",
        worker=worker.pid,
        index=worker.slot,
        owner=worker.owner,
    )
    arb.events.emit("worker_started", worker=worker)
    return worker


def _pick_to_retire(arb: Arbiter, candidates: list[WorkerProcess]) -> WorkerProcess:
    """Prefer a worker not inside a handler, then the youngest."""

    def busy(w: WorkerProcess) -> bool:
        state = arb.board.read(w.slot)
        return state is not None and state.pid == w.pid and state.phase == HANDLER

    return sorted(candidates, key=lambda w: (busy(w), -w.started_at))[0]


def finish(arb: Arbiter) -> None:
    """Stopping and every worker reaped (or a killed one refuses to die): done."""
    if not arb.stopping:
        return
    if arb.pool.workers:
        killed = [w for w in arb.pool.workers.values() if w.killed]
        started = arb.stop_started_at or arb.clock()
        limit = arb.config.timing.fast_stop_grace
        if arb.phase is Phase.STOPPING:
            limit += arb.config.worker.graceful_timeout
        if len(killed) < len(arb.pool.workers) or arb.clock() - started < limit:
            arb.wake_at(started + limit)
            return
        event("unreaped", f"{len(killed)} killed workers did not exit; giving up", level=WARN)
        for w in killed:
            arb.pending_release[w.owner] = arb.clock() + arb.config.worker.lease_ttl
        release(arb)
    arb.phase = Phase.DONE


def default_steps() -> list[Step]:
    return [
        Step("signals", handle_signals),
        Step("reap", reap),
        Step("reload", reload_probe),
        Step("deadlines", enforce_deadlines),
        Step("memory", check_memory),
        Step("roll", roll),
        Step("maintain", maintain),
        Step("drain", stop_when_drained),
        Step("publish", publish_state),
        Step("finish", finish),
    ]
