"""What ``supervisor start`` was asked to do: each option declared once (``workerproc.options``),
parsed by the CLI, checked by ``validate()``.

``StartConfig`` holds the ``WorkerConfig`` every worker gets (declared in ``workerproc.config``)
and adds what only the supervisor does; ``ChaosConfig`` is ``--chaos`` and its options.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workerproc import options
from workerproc.config import WorkerConfig
from workerproc.options import DAY, opt

from .errors import ConfigError

LOG_FORMATS = ("text", "json")
CHAOS_FAULTS = ("kill", "pause")
MAX_WORKERS = 256  # the shared status board's size: the most workers one supervisor runs


def cpu_count() -> int:
    """The CPUs this process may run on: ``-n``'s default, one worker per CPU (as Celery does).

    The affinity mask, not the machine's count, where the platform has one: a container limited
    to a cpuset, or a ``taskset``, gets as many workers as it has CPUs.
    """
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # a platform without affinity masks
        count = os.cpu_count() or 1
    return max(1, min(count, MAX_WORKERS))


@dataclass
class Timing:
    """Supervisor-internal timings. Tests shrink them; operators never need to."""

    tick: float = 1.0  # longest sleep of the main loop without a signal
    crash_window: float = 5.0  # a worker that dies sooner than this after start crashed at boot
    backoff_base: float = 0.5  # first delay after a boot crash; doubles per crash in a row
    backoff_cap: float = 30.0
    drain_check: float = 0.2  # how often --drain looks at the queue
    memory_check: float = 1.0  # how often RSS is compared with --max-worker-memory
    fast_stop_grace: float = 2.0  # QUIT/second TERM: wait this long for SIGKILLed workers
    state_every: float = 1.0  # how often the state file (status, health, scale) is rewritten
    reload_import_timeout: float = 120.0  # HUP: the import probe is killed past this (failed)
    reload_boot_timeout: float = 120.0  # HUP: a new worker not claiming after this fails it
    reload_crash_limit: int = 3  # HUP: new workers dying at start, in a row, that fail it


@dataclass
class ChaosConfig:
    """--chaos: inject faults into our own workers and verify takeover and fencing."""

    enabled: bool = opt(
        False,
        flag="--chaos",
        help="inject faults into our own workers and verify takeover and fencing",
    )
    interval: float = opt(
        5.0,
        flag="--chaos-interval",
        metavar="S",
        low=0.01,
        high=DAY,
        help="mean seconds between faults (each gap 0.5-1.5x, seeded)",
    )
    faults: tuple[str, ...] = opt(
        CHAOS_FAULTS,
        flag="--chaos-faults",
        metavar="LIST",
        choices=CHAOS_FAULTS,
        help="kill: SIGKILL a worker in its handler; pause: SIGSTOP one past 2x the ttl, "
        "then SIGCONT",
    )
    seed: int | None = opt(
        None,
        flag="--chaos-seed",
        metavar="N",
        low=0,
        high=2**63 - 1,
        shown_default="random",
        help="the RNG seed (logged; the same seed makes the same choices)",
    )
    report: str | None = opt(
        None, flag="--chaos-report", metavar="FILE", help="write the JSON report here at exit"
    )
    duration: float | None = opt(
        None,
        flag="--chaos-duration",
        metavar="S",
        low=0.1,
        high=365 * DAY,
        help="inject faults for S seconds, then only verify",
    )
    max_faults: int | None = opt(
        None,
        flag="--chaos-max-faults",
        metavar="K",
        low=1,
        high=10**6,
        help="inject at most K faults",
    )
    pause_for: float | None = opt(
        None,
        flag="--chaos-pause",
        metavar="S",
        low=1.0,
        high=DAY,
        shown_default="2x ttl",
        help="how long a paused worker stays stopped (at least 2x the ttl)",
    )

    def validate(self, lease_ttl: float) -> None:
        if self.enabled and self.pause_for is not None and self.pause_for < 2 * lease_ttl:
            raise ConfigError(
                "--chaos-pause must be at least 2x --lease-ttl (the zombie must outlive its lease)"
            )


@dataclass
class StartConfig:
    worker: WorkerConfig
    workers: int = opt(
        cpu_count(),
        flag="--workers",
        short="-n",
        metavar="N",
        low=1,
        high=MAX_WORKERS,
        shown_default="the CPU count",
        help="worker processes to keep alive",
    )
    drain: bool = opt(
        False, flag="--drain", help="stop (exit 0) once no task is ready, delayed or leased"
    )
    fail_on_failed: bool = opt(
        False,
        flag="--fail-on-failed",
        help="with --drain: exit 16 when any run failed during the drain",
    )
    pidfile: str | None = opt(
        None,
        flag="--pidfile",
        metavar="FILE",
        help="refuse a second supervisor; enables stop/reload/scale/health",
    )
    fast_release: bool = opt(
        True,
        flag="--fast-release/--no-fast-release",
        help="release a reaped worker's leases at once (off: they wait for the ttl)",
    )
    max_worker_memory: float | None = opt(
        None,
        flag="--max-worker-memory",
        metavar="MB",
        low=1.0,
        high=10**7,
        help="recycle a worker whose RSS exceeds this, after its current task",
    )
    max_tasks_per_worker: int | None = opt(
        None,
        flag="--max-tasks-per-worker",
        metavar="K",
        low=1,
        high=10**9,
        help="recycle a worker after about K tasks (±10 % jitter per worker)",
    )
    log_format: str = opt(
        "text",
        flag="--log-format",
        metavar="text|json",
        choices=LOG_FORMATS,
        help="one line per lifecycle event on stderr",
    )
    metrics_port: int | None = opt(
        None,
        flag="--metrics-port",
        metavar="PORT",
        low=0,
        high=65535,
        help="serve Prometheus /metrics (0: any free port, logged)",
        meaning="serve Prometheus `/metrics` (0: any free port, logged)",
    )
    metrics_host: str = opt(
        "127.0.0.1", flag="--metrics-host", metavar="ADDR", help="address for --metrics-port"
    )
    chaos: ChaosConfig = field(default_factory=ChaosConfig)
    timing: Timing = field(default_factory=Timing)

    def validate(self) -> StartConfig:
        """Raise ConfigError naming the first option that cannot work; return self."""
        try:
            options.validate(self)
            options.validate(self.chaos)
            self.worker.validate()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.chaos.validate(self.worker.lease_ttl)
        if self.fail_on_failed and not self.drain:
            raise ConfigError("--fail-on-failed needs --drain (it judges the runs of one drain)")
        return self

    def max_tasks_for_new_worker(self, rng: random.Random) -> int | None:
        """--max-tasks-per-worker with +-10% jitter, so workers do not all recycle at once."""
        if self.max_tasks_per_worker is None:
            return None
        return max(1, round(self.max_tasks_per_worker * rng.uniform(0.9, 1.1)))


def start_options() -> list[options.Declared]:
    """Every option of ``supervisor start``, in the order ``--help`` and the README show them:
    the pool size, then what each worker gets, then the supervisor's own, then chaos mode."""
    own = list(options.declared(StartConfig))
    worker = [d for d in options.declared(WorkerConfig) if d.opt.on_supervisor]
    return [own[0], *worker, *own[1:], *options.declared(ChaosConfig)]


def start_config(values: Mapping[str, Any]) -> StartConfig:
    """A checked StartConfig from option values keyed by option name (as click parses them)."""
    return options.build(
        StartConfig,
        values,
        worker=options.build(WorkerConfig, values),
        chaos=options.build(ChaosConfig, values),
    ).validate()
