"""The ``supervisor`` command: ``start`` runs the pool; the rest are operator commands.

Parse -> ``StartConfig`` -> ``validate()`` -> run. Every option can also come from
``SUPERVISOR_<OPTION>`` (``--help`` shows each variable).
"""

from __future__ import annotations

import click

from ..config import LOG_FORMATS, ChaosConfig, StartConfig
from . import control, database
from .clickutil import SupervisorGroup, option
from .start import run_start

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(name="supervisor", cls=SupervisorGroup, context_settings=CONTEXT)
def cli() -> None:
    """leasekeeper's supervisor: run a pool of workers and operate its database."""


@cli.command(context_settings={"show_default": True})
@option("-n", "--workers", type=int, default=1, help="worker processes to keep alive")
@option("--db", required=True, metavar="PATH|URL", help="file, sqlite:/// or postgresql:// URL")
@option("--app", required=True, metavar="MODULE:ATTR", help="the workerproc.App to run")
@option("--lease-ttl", type=float, default=60.0, metavar="S", help="lease time to live")
@option("--poll-interval", type=float, default=1.0, metavar="S", help="idle claim interval")
@option("--max-attempts", type=int, default=3, metavar="K", help="deliveries before a run fails")
@option("--task-timeout", type=float, default=None, metavar="S", help="hard limit per task")
@option(
    "--heartbeat-interval", type=float, default=None, metavar="S", help="default: lease ttl / 3"
)
@option("--drain", is_flag=True, default=False, help="stop (exit 0) once no work is left")
@option("--pidfile", default=None, metavar="FILE", help="refuse to start twice; lets stop/scale")
@option(
    "--graceful-timeout",
    type=float,
    default=30.0,
    metavar="S",
    help="on stop, how long workers may finish their task before SIGKILL",
)
@option(
    "--fast-release/--no-fast-release",
    default=True,
    help="release a dead worker's leases at once (off: wait for the lease ttl)",
)
@option(
    "--max-worker-memory",
    type=float,
    default=None,
    metavar="MB",
    help="recycle a worker whose RSS exceeds this, after its current task",
)
@option(
    "--max-tasks-per-worker",
    type=int,
    default=None,
    metavar="K",
    help="recycle a worker after about K tasks (+-10% jitter)",
)
@option("--log-format", type=click.Choice(LOG_FORMATS), default="text", help="log line format")
@option("--metrics-port", type=int, default=None, metavar="PORT", help="serve Prometheus /metrics")
@option("--metrics-host", default="127.0.0.1", metavar="ADDR", help="address for --metrics-port")
@option("--chaos", is_flag=True, default=False, help="inject faults into our own workers")
@option(
    "--chaos-interval", type=float, default=5.0, metavar="S", help="mean seconds between faults"
)
@option(
    "--chaos-faults",
    default="kill,pause",
    metavar="LIST",
    help="faults to inject: kill (SIGKILL), pause (SIGSTOP past the ttl, then SIGCONT)",
)
@option("--chaos-seed", type=int, default=None, metavar="N", help="seed (default random, logged)")
@option("--chaos-report", default=None, metavar="FILE", help="write the JSON report here at exit")
@option("--chaos-duration", type=float, default=None, metavar="S", help="inject for S seconds")
@option("--chaos-max-faults", type=int, default=None, metavar="K", help="inject at most K faults")
@option("--chaos-pause", type=float, default=None, metavar="S", help="pause length (2x ttl)")
def start(
    workers: int,
    db: str,
    app: str,
    lease_ttl: float,
    poll_interval: float,
    max_attempts: int,
    task_timeout: float | None,
    heartbeat_interval: float | None,
    drain: bool,
    pidfile: str | None,
    graceful_timeout: float,
    fast_release: bool,
    max_worker_memory: float | None,
    max_tasks_per_worker: int | None,
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
    chaos: bool,
    chaos_interval: float,
    chaos_faults: str,
    chaos_seed: int | None,
    chaos_report: str | None,
    chaos_duration: float | None,
    chaos_max_faults: int | None,
    chaos_pause: float | None,
) -> int:
    """Fork N workers and keep them alive until TERM/INT (graceful) or QUIT (fast)."""
    config = StartConfig(
        app=app,
        db=db,
        workers=workers,
        lease_ttl=lease_ttl,
        poll_interval=poll_interval,
        max_attempts=max_attempts,
        task_timeout=task_timeout,
        heartbeat_interval=heartbeat_interval,
        drain=drain,
        pidfile=pidfile,
        graceful_timeout=graceful_timeout,
        fast_release=fast_release,
        max_worker_memory=max_worker_memory,
        max_tasks_per_worker=max_tasks_per_worker,
        log_format=log_format,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        chaos=ChaosConfig(
            interval=chaos_interval,
            faults=tuple(f.strip() for f in chaos_faults.split(",") if f.strip()),
            seed=chaos_seed,
            report=chaos_report,
            duration=chaos_duration,
            max_faults=chaos_max_faults,
            pause_for=chaos_pause,
        )
        if chaos
        else None,
    ).validate()
    return run_start(config)


for command in database.ALL + control.ALL:
    cli.add_command(command)


def main() -> None:
    cli.main(prog_name="supervisor")
