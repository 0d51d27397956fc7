"""``python -m workerproc --db PATH --app MOD:ATTR``: one worker, without the supervisor."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from . import exitcodes
from .runner import AppLoadError, WorkerConfig, load_app, run_worker


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workerproc", description=__doc__)
    p.add_argument("--db", required=True, help="database path, sqlite:/// or postgresql:// URL")
    p.add_argument("--app", required=True, help="the App to run, as package.module:attr")
    p.add_argument("--lease-ttl", type=float, default=60.0)
    p.add_argument("--poll-interval", type=float, default=1.0)
    p.add_argument("--max-attempts", type=int, default=3)
    p.add_argument("--task-timeout", type=float, default=None)
    p.add_argument("--max-tasks", type=int, default=None)
    p.add_argument("--heartbeat-interval", type=float, default=None)
    p.add_argument("--retry-backoff", type=float, default=1.0)
    p.add_argument("--exit-with-parent", action="store_true", help="die when the parent dies")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = WorkerConfig(
        db=args.db,
        lease_ttl=args.lease_ttl,
        poll_interval=args.poll_interval,
        max_attempts=args.max_attempts,
        task_timeout=args.task_timeout,
        max_tasks=args.max_tasks,
        heartbeat_interval=args.heartbeat_interval,
        retry_backoff=args.retry_backoff,
    )
    try:
        config.validate()
        app = load_app(args.app)
    except (ValueError, AppLoadError) as exc:
        print(f"workerproc: {exc}", file=sys.stderr)
        return exitcodes.BOOT_FAILURE
    parent = os.getppid() if args.exit_with_parent else None
    return run_worker(app, config, parent_pid=parent)


if __name__ == "__main__":
    sys.exit(main())
