"""``scripts/bench``: every benchmark of this repository, one command with subcommands.

    scripts/bench --parts cli,startup,noop,slots,limits,pg,webhooks --before REV [--quick]
        the speed goals' parts, this checkout beside REV in the same run, one goals table
        (scripts/bench_parts.py; <= 35 minutes on 2 cores; --help with --parts says more)
    scripts/bench throughput [--quick] [--parts ...]   ours beside huey and procrastinate
    scripts/bench before REV                          this checkout against an earlier commit
    scripts/bench once                                a paid call's keep latency
    scripts/bench streams                             a stream's latency and chunks/s
    scripts/bench cli                                 each CLI command's answer time
    scripts/bench idle                                an idle pool's CPU and memory
    scripts/bench pgbouncer                           PostgreSQL straight and through PgBouncer
    scripts/bench batch                               a batch step's runs/s, batch=64 and =1
    scripts/bench SUBCOMMAND --help                   each one's options

Each subcommand is a module of this directory (``bench_<name>.py``) with ``add_arguments`` (its
options, added to the subcommand's parser here) and ``run`` (given the parsed arguments, with
``args.parser`` for a usage error); only the chosen one is imported, so a subcommand whose peer
is not installed (huey, procrastinate: the ``bench`` extra) does not stop the others.
``scripts/bench`` prepares the virtual environment and runs this file; run directly, it is
``python scripts/bench.py SUBCOMMAND ...`` in an environment that has the project.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
# subcommand -> (module, what it measures)
SUBCOMMANDS = {
    "throughput": ("bench_throughput", "no-op and I/O-bound throughput, pickup, takeover and "
                   "RSS beside huey, and the PostgreSQL rows beside procrastinate"),
    "before": ("bench_before", "throughput, idle pickup and takeover: this checkout against an "
               "earlier commit, in the same run"),
    "store": ("bench_store", "the store alone: claim latency at depth, hot runs, producers, "
              "write-lock fairness"),
    "once": ("bench_once", "a paid call's keep latency, fn's return to once returning"),
    "streams": ("bench_streams", "runs' streams: emit -> readable latency, chunks/s"),
    "cli": ("bench_cli", "the CLI's answer time per command and a one-run pool's start-up"),
    "idle": ("bench_idle", "an idle pool's CPU per process (a schedule, a parked webhook) and "
             "the RSS of the supervisor and its workers"),
    "batch": ("bench_batch", "batch steps: runs/s of a no-op batch step at batch=64 and =1"),
    "limits": ("bench_limits", "flow control's cost, on SQLite and PostgreSQL"),
    "events": ("bench_events", "the outbox's cost: events on against a tree without them"),
    "waits": ("bench_waits", "the claim's latency beside runs that wait for a signal"),
    "webhooks": ("bench_webhooks", "webhook delivery: rate and commit-to-receipt latency"),
    "web": ("bench_web", "a pool's throughput with and without a busy dashboard"),
    "worker": ("bench_worker", "idle pickup and the ttl path for standalone workers"),
    "pg-cost": ("bench_pg_cost", "PostgreSQL: the server's CPU and dead row versions per run"),
    "pg-floor": ("bench_pg_floor", "PostgreSQL: the raw floor of idle pickup, none of our code"),
    "pgbouncer": ("bench_pgbouncer", "PostgreSQL: throughput straight and through PgBouncer"),
    "profile": ("bench_profile", "SQLite, -n 2 --concurrency 16: CPU per run by process, and "
                "a cProfile of the workers (SQLite's share, the top functions)"),
}  # fmt: skip


def parser(chosen: str | None) -> argparse.ArgumentParser:
    """The command's parser; ``chosen``'s module is imported and adds its options."""
    doc = __doc__ or ""
    ap = argparse.ArgumentParser(prog="scripts/bench", description=doc.split("\n\n")[0].strip(
        "`"), formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    subs = ap.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
    for name, (module, what) in SUBCOMMANDS.items():
        sub = subs.add_parser(name, help=what, description=what,
                              formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
        if name == chosen:
            mod = importlib.import_module(module)
            sub.description = mod.__doc__
            mod.add_arguments(sub)
            sub.set_defaults(run=mod.run, parser=sub)
    return ap


def parts_parser() -> argparse.ArgumentParser:
    """``scripts/bench --parts ... --before REV``: no subcommand (scripts/bench_parts.py)."""
    mod = importlib.import_module("bench_parts")
    ap = argparse.ArgumentParser(prog="scripts/bench", description=mod.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    mod.add_arguments(ap)
    ap.set_defaults(run=mod.run, parser=ap)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].startswith("--") and argv[0] != "--help":  # the options, no subcommand
        args = parts_parser().parse_args(argv)
        return int(args.run(args) or 0)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    args = parser(chosen if chosen in SUBCOMMANDS else None).parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    if HERE not in sys.path:
        sys.path.insert(0, HERE)  # the benchmarks' modules import each other by name
    sys.exit(main())
