"""What one worker process is asked to do. Each field is declared once (``options.opt``): the
supervisor's ``start`` command, ``python -m workerproc``, their environment variables, the checks
and the README's option table all come from these declarations."""

from __future__ import annotations

from dataclasses import dataclass

from . import options
from .logs import LEVELS
from .options import DAY, opt
from .store import InvalidPayload
from .store.codec import check_queue


@dataclass(frozen=True)
class WorkerConfig:
    db: str = opt(
        flag="--db",
        metavar="PATH|URL",
        help="database file or URL (sqlite:///…, postgresql://…); a file is created if missing, "
        "unless its -wal is still there",
    )
    app: str = opt(flag="--app", metavar="MODULE:ATTR", help="the workerproc.App to run")
    lease_ttl: float = opt(
        60.0, flag="--lease-ttl", metavar="S", low=0.5, high=DAY, help="lease time to live"
    )
    poll_interval: float = opt(
        1.0,
        flag="--poll-interval",
        metavar="S",
        low=0.01,
        high=3600.0,
        help="idle claim interval of each worker",
    )
    max_attempts: int = opt(
        3,
        flag="--max-attempts",
        metavar="K",
        low=1,
        high=1000,
        help="deliveries of a task before its run fails",
    )
    task_timeout: float | None = opt(
        None,
        flag="--task-timeout",
        metavar="S",
        low=0.1,
        high=7 * DAY,
        help="hard limit per task",
        meaning="hard limit per task (the worker exits 70 and is replaced)",
    )
    heartbeat_interval: float | None = opt(
        None,
        flag="--heartbeat-interval",
        metavar="S",
        low=0.05,
        high=DAY,
        shown_default="ttl / 3",
        help="lease renewal period (below the lease ttl)",
    )
    retry_backoff: float = opt(
        1.0,
        flag="--retry-backoff",
        metavar="S",
        low=0.0,
        high=DAY,
        help="first retry delay after a handler error; doubles per attempt (±25 % jitter)",
    )
    retry_backoff_max: float = opt(
        300.0,
        flag="--retry-backoff-max",
        metavar="S",
        low=0.0,
        high=7 * DAY,
        help="the longest retry delay",
    )
    concurrency: int = opt(
        1,
        flag="--concurrency",
        metavar="C",
        low=1,
        high=1024,
        help="slots per worker process: handlers running at once (plain ones on threads, "
        "async ones on an event loop; 1: one at a time on the main thread)",
    )
    prefetch: int | None = opt(
        None,
        flag="--prefetch",
        metavar="K",
        low=0,
        high=1000,
        shown_default="adaptive",
        help="tasks a worker may claim beyond its free slots (adaptive: up to 32, only while "
        "its recent handlers finished within 5 ms)",
    )
    queues: tuple[str, ...] | None = opt(
        None,
        flag="--queues",
        metavar="LIST",
        shown_default="all",
        help="claim only from these queues (comma-separated)",
    )
    graceful_timeout: float = opt(
        30.0,
        flag="--graceful-timeout",
        metavar="S",
        low=0.0,
        high=DAY,
        help="how long a stopping worker may finish its running tasks (then the supervisor "
        "SIGKILLs it; a worker that must exit gives up on its other slots)",
    )
    log_level: str = opt(
        "info",
        flag="--log-level",
        metavar="LEVEL",
        choices=LEVELS,
        help="the lowest level logged, of the pool's events and your handlers' own records "
        "(logging.getLogger(__name__) in a task: each carries its run, task, attempt and "
        "worker): debug, info, warning, error or critical",
    )
    max_tasks: int | None = opt(
        None,
        flag="--max-tasks",
        metavar="K",
        low=1,
        high=10**9,
        help="exit 73 after K tasks (the supervisor sets it from --max-tasks-per-worker)",
        on_supervisor=False,
    )

    def validate(self) -> WorkerConfig:
        """Raise ValueError naming the first option that cannot work; return self."""
        options.validate(self)
        module, sep, attr = self.app.partition(":")
        if not (sep and module.strip() and attr.strip()):
            raise ValueError(f"--app must look like MODULE:ATTR (got {self.app!r})")
        if self.heartbeat_interval is not None and self.heartbeat_interval >= self.lease_ttl:
            raise ValueError("--heartbeat-interval must be below --lease-ttl")
        if self.retry_backoff > self.retry_backoff_max:
            raise ValueError("--retry-backoff must not exceed --retry-backoff-max")
        if self.queues is not None:
            if not self.queues:
                raise ValueError("--queues must name at least one queue")
            for name in self.queues:
                try:  # (leasekeeper's own queue included: a worker may serve it)
                    check_queue(name)
                except InvalidPayload as exc:
                    raise ValueError(f"--queues: {exc}") from None
        return self

    @property
    def interval(self) -> float:
        """The heartbeat period (R4): every ttl / 3 unless set."""
        return self.heartbeat_interval or self.lease_ttl / 3
