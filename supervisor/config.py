"""What ``supervisor start`` was asked to do: parsed by the CLI, checked by ``validate()``."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from .errors import ConfigError

LOG_FORMATS = ("text", "json")


@dataclass
class Timing:
    """Supervisor-internal timings. Tests shrink them; operators never need to."""

    tick: float = 1.0  # longest sleep of the main loop without a signal
    crash_window: float = 5.0  # a worker that dies sooner than this after start crashed at boot
    backoff_base: float = 0.5  # first delay after a boot crash; doubles per crash in a row
    backoff_cap: float = 30.0
    drain_check: float = 0.2  # how often --drain looks at the queue
    memory_check: float = 1.0  # how often RSS is compared with --max-worker-memory
    ready_after: float = 0.5  # a new worker counts as up (HUP rolling) after this long alive
    fast_stop_grace: float = 2.0  # QUIT/second TERM: wait this long for SIGKILLed workers
    state_every: float = 1.0  # how often the state file (status, health, scale) is rewritten
    reload_import_timeout: float = 120.0  # HUP: the import probe is killed past this (failed)
    reload_boot_timeout: float = 120.0  # HUP: a new worker not claiming after this fails it
    reload_crash_limit: int = 3  # HUP: new workers dying at start, in a row, that fail it


CHAOS_FAULTS = ("kill", "pause")


@dataclass
class ChaosConfig:
    """--chaos: inject faults into our own workers and verify takeover and fencing."""

    interval: float = 5.0  # mean seconds between faults (each gap is 0.5x-1.5x, seeded)
    faults: tuple[str, ...] = CHAOS_FAULTS
    seed: int | None = None  # None: a random seed, logged
    report: str | None = None  # JSON report path, written at exit
    duration: float | None = None  # stop injecting after this many seconds (keep verifying)
    max_faults: int | None = None
    pause_for: float | None = None  # how long a paused worker stays stopped; default 2x ttl

    def validate(self, lease_ttl: float) -> None:
        checks = [
            (self.interval > 0, "--chaos-interval must be greater than 0"),
            (
                bool(self.faults) and set(self.faults) <= set(CHAOS_FAULTS),
                f"--chaos-faults must be a comma-separated subset of {','.join(CHAOS_FAULTS)}",
            ),
            (self.duration is None or self.duration > 0, "--chaos-duration must be > 0"),
            (self.max_faults is None or self.max_faults >= 1, "--chaos-max-faults must be >= 1"),
            (
                self.pause_for is None or self.pause_for >= 2 * lease_ttl,
                "--chaos-pause must be at least 2x --lease-ttl (the zombie must outlive its lease)",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)


@dataclass
class StartConfig:
    app: str
    db: str
    workers: int = 1
    lease_ttl: float = 60.0
    poll_interval: float = 1.0
    max_attempts: int = 3
    task_timeout: float | None = None
    heartbeat_interval: float | None = None
    drain: bool = False
    pidfile: str | None = None
    graceful_timeout: float = 30.0
    fast_release: bool = True
    max_worker_memory: float | None = None  # MB of RSS
    max_tasks_per_worker: int | None = None
    log_format: str = "text"
    metrics_port: int | None = None  # serve Prometheus metrics (supervisor/metrics.py)
    metrics_host: str = "127.0.0.1"
    chaos: ChaosConfig | None = None
    timing: Timing = field(default_factory=Timing)

    def validate(self) -> StartConfig:
        """Raise ConfigError naming the first option that cannot work; return self."""
        checks: list[tuple[bool, str]] = [
            (self.workers >= 1, f"-n/--workers must be at least 1 (got {self.workers})"),
            (":" in self.app and all(self.app.split(":", 1)), "--app must look like MODULE:ATTR"),
            (bool(self.db.strip()), "--db must name a database file or URL"),
            (self.lease_ttl > 0, "--lease-ttl must be greater than 0"),
            (self.poll_interval > 0, "--poll-interval must be greater than 0"),
            (self.max_attempts >= 1, "--max-attempts must be at least 1"),
            (self.task_timeout is None or self.task_timeout > 0, "--task-timeout must be > 0"),
            (self.graceful_timeout >= 0, "--graceful-timeout must be 0 or more"),
            (
                self.max_worker_memory is None or self.max_worker_memory > 0,
                "--max-worker-memory must be greater than 0 (MB)",
            ),
            (
                self.max_tasks_per_worker is None or self.max_tasks_per_worker >= 1,
                "--max-tasks-per-worker must be at least 1",
            ),
            (self.log_format in LOG_FORMATS, f"--log-format must be one of {LOG_FORMATS}"),
            (
                self.metrics_port is None or 0 <= self.metrics_port <= 65535,
                "--metrics-port must be between 0 and 65535 (0: any free port)",
            ),
        ]
        if self.heartbeat_interval is not None:
            checks.append(
                (
                    0 < self.heartbeat_interval < self.lease_ttl,
                    "--heartbeat-interval must be greater than 0 and less than --lease-ttl",
                )
            )
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        if self.chaos is not None:
            self.chaos.validate(self.lease_ttl)
        return self

    def max_tasks_for_new_worker(self, rng: random.Random) -> int | None:
        """--max-tasks-per-worker with +-10% jitter, so workers do not all recycle at once."""
        if self.max_tasks_per_worker is None:
            return None
        return max(1, round(self.max_tasks_per_worker * rng.uniform(0.9, 1.1)))
