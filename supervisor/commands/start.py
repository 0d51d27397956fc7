"""``supervisor start``: from a validated config to a running loop, and a clean exit.

Order matters: signal handlers first (a TERM during start-up is recorded, not lost), then the
app import (fail fast), the pidfile, the store check and the release of leases left by dead
workers of a previous supervisor on this host; only then the first fork.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from workerproc import App
from workerproc.runner import AppLoadError, WorkerConfig, load_app
from workerproc.status import StatusBoard
from workerproc.store import is_postgres_url

from .. import exitcodes, integrations, logs
from ..collector import lasting
from ..config import StartConfig
from ..errors import AppImportError, SupervisorError
from ..logs import event
from ..loop.arbiter import Arbiter, Step
from ..loop.failures import drain_began
from ..loop.failures import exit_code as drain_exit_code
from ..loop.forking import ForkContext, fork_probe, fork_worker, other_threads
from ..loop.guard import RESTORE, DbGuard, bounded_quick_check, checked_drain
from ..loop.pidfile import Pidfile
from ..loop.pool import Pool, imports_app
from ..loop.progress import StallWatch
from ..loop.reload import Reloads
from ..loop.report import watch_drain
from ..loop.signals import SignalInbox
from ..loop.steps import default_steps
from ..loop.storegate import StoreGate

if TYPE_CHECKING:
    from ..chaos import Chaos

BOARD_CAPACITY = 256  # status slots: the most workers one supervisor can run (TTIN stops there)


def import_app(spec: str) -> App:
    try:
        app = load_app(spec)
    except AppLoadError as exc:
        raise AppImportError(str(exc)) from None
    if threads := other_threads():  # forking them away could deadlock the workers
        raise AppImportError(
            f"importing {spec} started threads ({', '.join(threads)}): the supervisor forks "
            "its workers from a single thread; start threads inside tasks or lazily instead"
        )
    return app


def worker_config(config: StartConfig, max_tasks: int | None) -> WorkerConfig:
    """What one new worker gets: the pool's worker options and its own task budget."""
    return dataclasses.replace(config.worker, max_tasks=max_tasks)


def check_at_start(gate: StoreGate) -> None:
    """Refuse to start on a corrupt database (exit 1) when it is small enough to check."""
    problems = bounded_quick_check(gate, "start-up")
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise SupervisorError(
            f"the database {gate.file} is corrupt (quick_check: {problems[0]}{more}): {RESTORE}"
        )


def build(config: StartConfig, inbox: SignalInbox, pidfile: Pidfile | None) -> Arbiter:
    """Everything the loop needs, wired; nothing forked yet."""
    app = import_app(config.worker.app)
    gate = StoreGate(config.worker.db)
    check_at_start(gate)
    released = gate.release_dead_owners()  # also proves the database opens, before any fork
    for owner, count in released.items():
        event(
            "leases_released",
            f"released {count} lease(s) of {owner}, dead before this supervisor started",
            owner=owner,
            count=count,
        )
    gate.pin()  # from here on the path must keep naming this file (loop.guard)
    board = StatusBoard(BOARD_CAPACITY)
    child_closers: list[Callable[[], None]] = []  # sockets of integrations.install

    def child_cleanup() -> None:
        if pidfile is not None:
            pidfile.close_in_child()
        for close in child_closers:
            close()

    ctx = ForkContext(
        app=app,
        worker_config=lambda max_tasks: worker_config(config, max_tasks),
        board=board,
        inbox=inbox,
        before_fork=gate.before_fork,
        child_cleanup=child_cleanup,
        app_spec=config.worker.app,
    )

    def spawner(slot: int, max_tasks: int | None) -> tuple[int, str]:
        board.slot(slot).clear()
        return fork_worker(ctx, slot, max_tasks, fresh_import=imports_app(pool.generation))

    pool = Pool(spawner, timing=config.timing, capacity=BOARD_CAPACITY, target=config.workers)
    arbiter = Arbiter(
        config=config,
        app=app,
        pool=pool,
        inbox=inbox,
        gate=gate,
        board=board,
        reloads=Reloads(start_probe=lambda: fork_probe(ctx)),
        pidfile=pidfile,
        steps=default_steps(),
    )
    arbiter.add_step(Step("dbguard", DbGuard().step), before="reap")
    arbiter.add_step(Step("progress", StallWatch().step), before="publish")
    child_closers += integrations.install(arbiter)  # sd_notify, watchdog, metrics
    drain_began(arbiter)  # before the first fork: what fails from here on is the drain's
    child_closers.append(watch_drain(arbiter))
    chaos = None
    if config.chaos.enabled:
        from ..chaos import Chaos  # noqa: PLC0415 - a pool without --chaos (and its workers,
        # forked from it) does not load it

        chaos = Chaos(
            config.chaos,
            ttl=config.worker.lease_ttl,
            poll_interval=config.worker.poll_interval,
            fast_release=config.fast_release,
            max_attempts=config.worker.max_attempts,
            server=is_postgres_url(config.worker.db),
        )
        chaos.install(arbiter)
    exit_rules(arbiter, chaos)
    return arbiter


def exit_rules(arbiter: Arbiter, chaos: Chaos | None) -> None:
    """What decides the exit code once the loop is done, in this order: chaos's verdict (a
    violation exits 8, whatever else happened: safety first), then the quick check that ends a
    finished drain on SQLite (17: the database is damaged), then ``--fail-on-failed`` (16,
    for a drain that finished with exit 0 and failed runs). Each keeps a code that is not 0."""
    if chaos is not None:
        arbiter.exit_hooks.append(
            lambda arb, code: chaos.conclude(arb, code, exitcodes.CHAOS_VIOLATION)
        )
    arbiter.exit_hooks.append(checked_drain)  # a damaged database: 17, before 16
    arbiter.exit_hooks.append(drain_exit_code)


def run_start(config: StartConfig) -> int:
    config.validate()
    progress = logs.setup(config.log_format, level=config.worker.log_level)
    inbox = SignalInbox()
    inbox.install()
    pidfile = Pidfile(config.pidfile) if config.pidfile else None
    arbiter: Arbiter | None = None
    try:
        if pidfile is not None:
            pidfile.acquire()
        with lasting():  # the app's and the store's imports, the loop's parts: for good
            arbiter = build(config, inbox, pidfile)
        arbiter.progress = progress if config.drain else None
        code = arbiter.run()
        event("supervisor_stopped", f"supervisor stopped (exit code {code})", code=code)
        return code
    finally:
        if arbiter is not None:
            arbiter.gate.close_kept()
        if arbiter is not None and arbiter.pool.workers:  # only after a bug in the loop
            for worker in list(arbiter.pool.workers.values()):
                arbiter.pool.kill_now(worker, "supervisor crashed")
        progress.finish()
        if pidfile is not None:
            pidfile.release()
        inbox.uninstall()
        inbox.close()
