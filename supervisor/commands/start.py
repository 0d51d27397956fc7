"""``supervisor start``: from a validated config to a running loop, and a clean exit.

Order matters: signal handlers first (a TERM during start-up is recorded, not lost), then the
app import (fail fast), the pidfile, the store check and the release of leases left by dead
workers of a previous supervisor on this host; only then the first fork.
"""

from __future__ import annotations

from collections.abc import Callable

from workerproc import App
from workerproc.runner import AppLoadError, WorkerConfig, load_app
from workerproc.status import StatusBoard

from .. import exitcodes, integrations, logs
from ..chaos import Chaos
from ..config import StartConfig
from ..errors import AppImportError
from ..logs import event
from ..loop.arbiter import Arbiter
from ..loop.forking import ForkContext, fork_probe, fork_worker, other_threads
from ..loop.pidfile import Pidfile
from ..loop.pool import Pool, imports_app
from ..loop.reload import Reloads
from ..loop.signals import SignalInbox
from ..loop.steps import default_steps
from ..loop.storegate import StoreGate

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
    return WorkerConfig(
        db=config.db,
        lease_ttl=config.lease_ttl,
        poll_interval=config.poll_interval,
        max_attempts=config.max_attempts,
        task_timeout=config.task_timeout,
        max_tasks=max_tasks,
        heartbeat_interval=config.heartbeat_interval,
    )


def build(config: StartConfig, inbox: SignalInbox, pidfile: Pidfile | None) -> Arbiter:
    """Everything the loop needs, wired; nothing forked yet."""
    app = import_app(config.app)
    gate = StoreGate(config.db)
    released = gate.release_dead_owners()  # also proves the database opens, before any fork
    for owner, count in released.items():
        event(
            "leases_released",
            f"released {count} lease(s) of {owner}, dead before this supervisor started",
            owner=owner,
            count=count,
        )
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
        before_fork=gate.assert_closed,
        child_cleanup=child_cleanup,
        app_spec=config.app,
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
    child_closers += integrations.install(arbiter)  # sd_notify, watchdog, metrics
    if config.chaos is not None:
        chaos = Chaos(
            config.chaos,
            ttl=config.lease_ttl,
            poll_interval=config.poll_interval,
            fast_release=config.fast_release,
        )
        chaos.install(arbiter)
        arbiter.exit_hooks.append(
            lambda arb, code: chaos.conclude(arb, code, exitcodes.CHAOS_VIOLATION)
        )
    return arbiter


def run_start(config: StartConfig) -> int:
    config.validate()
    progress = logs.setup(config.log_format)
    inbox = SignalInbox()
    inbox.install()
    pidfile = Pidfile(config.pidfile) if config.pidfile else None
    arbiter: Arbiter | None = None
    try:
        if pidfile is not None:
            pidfile.acquire()
        arbiter = build(config, inbox, pidfile)
        arbiter.progress = progress if config.drain else None
        code = arbiter.run()
        event("supervisor_stopped", f"supervisor stopped (exit code {code})", code=code)
        return code
    finally:
        if arbiter is not None and arbiter.pool.workers:  # only after a bug in the loop
            for worker in list(arbiter.pool.workers.values()):
                arbiter.pool.kill_now(worker, "supervisor crashed")
        progress.finish()
        if pidfile is not None:
            pidfile.release()
        inbox.uninstall()
        inbox.close()
