"""``scripts/bench pgbouncer``: PostgreSQL throughput straight to the server beside the same
through PgBouncer in transaction mode (a private one on a free port: tests/support/pgbouncer.py),
woken by LISTEN straight to the server and by polling. ``supervisor start -n W --drain`` over
M one-step no-op runs, the median of R rounds, the sides alternated each round.

Behind a transaction pooler each transaction sets its own bounds (``SET LOCAL`` in the query of
its BEGIN), a read is a transaction of its own (BEGIN, the read, COMMIT) and nothing is
prepared: this measures what that costs, beside the pooler's own hop."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import bench_args
from bench_pg import ENV, HERE, PY, bench_database, bulk_noop_runs, schema_url, succeeded

sys.path.append(str(HERE.parent / "tests" / "support"))
import pgbouncer


def drain(direct: str, url: str, m: int, w: int) -> float:
    """Runs/s of ``supervisor start -n w --drain`` at ``url`` over ``m`` runs written at
    ``direct`` (the same schema, straight to the server)."""
    bulk_noop_runs(direct, m)
    cmd = [PY, "-m", "supervisor", "start", "-n", str(w), "--db", url, "--app", "benchapp:app",
           "--drain"]  # fmt: skip
    started = time.monotonic()
    done_by = subprocess.run(cmd, cwd=HERE, env=ENV, stderr=subprocess.DEVNULL, timeout=1800)
    code = done_by.returncode
    elapsed = time.monotonic() - started
    done = succeeded(direct)
    if code != 0 or done != m:
        raise SystemExit(f"{url}: exit {code}, {done} of {m} runs succeeded")
    return m / elapsed


def add_arguments(ap: argparse.ArgumentParser) -> None:
    bench_args.add_postgres(ap)
    bench_args.add_quick(ap)
    ap.add_argument("--tasks", type=int, help="no-op runs per side (5,000; quick 500)")
    ap.add_argument("--rounds", type=int, help="rounds (3; quick 1)")
    ap.add_argument("--workers", type=int, default=4, help="worker processes (4)")


def run(args: argparse.Namespace) -> int:
    m = args.tasks or (500 if args.quick else 5_000)
    rounds = args.rounds or (1 if args.quick else 3)
    if pgbouncer.binary() is None:
        print("pgbouncer is not installed (apt-get install -y pgbouncer)", file=sys.stderr)
        return 1
    results: dict[str, list[float]] = {}
    with bench_database(args.postgres) as database, pgbouncer.running(database) as bouncer:
        sides = {
            "direct": lambda d: d,
            "PgBouncer, listen=direct": lambda d: bouncer.url(d, "direct"),
            "PgBouncer, listen=poll": lambda d: bouncer.url(d, "poll"),
        }
        for r in range(rounds):
            for name, route in sides.items() if r % 2 == 0 else reversed(sides.items()):
                direct = schema_url(database, "bouncer")
                value = drain(direct, route(direct), m, args.workers)
                results.setdefault(name, []).append(value)
                print(f"  round {r + 1}: {name:<26} {value:8.0f} runs/s", file=sys.stderr,
                      flush=True)  # fmt: skip
        print(f"\n{pgbouncer.version()}, pool_mode = transaction; {m:,} no-op runs, "
              f"-n {args.workers} --drain, median of {rounds}\n")  # fmt: skip
        print("| route | runs/s | of direct |")
        print("| --- | ---: | ---: |")
        base = statistics.median(results["direct"])
        for name in sides:
            value = statistics.median(results[name])
            print(f"| {name} | {value:,.0f} | {value / base:.0%} |")
    return 0
