"""``scripts/bench --parts P,Q --before REV``: the speed goals' parts, this checkout beside an
earlier commit in the same run, ending with one goals table (scripts/bench_parts_goals.py).

    scripts/bench --parts cli,startup,noop,slots,limits,pg,webhooks --before a3296d1
    scripts/bench --parts noop,slots --before a3296d1 --quick      # a smoke run, no figures

Parts (each measures this checkout, "now", and REV, "before", rounds alternating who goes
first; huey and procrastinate, when installed, beside in the same rounds):

  cli       each one-run command (--version, --help, enqueue, show, signal, cancel, retry) as a
            new process on an idle SQLite database, 10 calls each per tree, interleaved
  startup   ``supervisor start -n 2 --drain`` on one run: launch to exit, the first claim after
            the pool's start; 6 per tree
  noop      20,000 no-op runs drained at -n 2 and -n 8 (from launch), huey -w 8 beside, 3 rounds
  slots     40,000 no-op runs at -n 2 --concurrency 16 beside the bare batched loop (two
            processes, 8 tasks a transaction, FULL) in the same rounds, 3 rounds; then the I/O
            row: 1,000 steps of 0.5 s at -n 2 --concurrency 250 beside huey's 500 threads
  limits    20,000 no-op runs at -n 2 behind a limit that never binds and without, medians of
            5 interleaved rounds, SQLite and PostgreSQL; a batched claim of 16 with 10,000 keys
            of a binding per-key cap (concurrency 1 a key) over 50,000 runs and without
  pg        PostgreSQL: 20,000 no-op runs at -n 4 --concurrency 8, runs/s and the server's CPU
            per run, 3 rounds
  webhooks  2,000 runs with a webhook, then a webhook added over 2,000 done runs (catch-up,
            the goal's figure), SQLite and PostgreSQL, 3 rounds

The sizes are picked so the full run of those seven, both trees and the peers, fits in 35
minutes on the 2-core VM: about 15-20 when it is quiet (limits are the longest part, about 7:
40 drains and 8 backlogs of 50,000 runs), and each rate is a median of 3 rounds (limits 5).
``--quick`` shrinks every size for a smoke run of a minute or two whose figures mean nothing.
Each side's figure goes to stderr as it is measured; the table to stdout at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import bench_args
import bench_cli
from bench_parts_goals import Figures, print_goals

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "scripts"
PARTS = ("cli", "startup", "noop", "slots", "limits", "pg", "webhooks")
# name -> (full, quick)
SIZES = {
    "cli_samples": (10, 2), "drains": (6, 2),
    "noop_tasks": (20_000, 1_000), "noop_rounds": (3, 1),
    "slots_tasks": (40_000, 1_500), "slots_rounds": (3, 1),
    "io_runs": (1_000, 100), "io_seconds": (0.5, 0.1),
    "limits_tasks": (20_000, 300), "limits_rounds": (5, 1), "keys": (10_000, 200),
    "waiting": (50_000, 2_000), "claims": (200, 8),
    "pg_tasks": (20_000, 1_000), "pg_rounds": (3, 1),
    "hook_runs": (2_000, 100), "hook_rounds": (3, 1), "trickle": (40, 3),
}  # fmt: skip


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--parts", default=",".join(PARTS), help=f"some of {','.join(PARTS)}")
    ap.add_argument("--before", default="", help="an earlier commit measured beside this "
                    "checkout in the same run ('' : this checkout alone)")  # fmt: skip
    bench_args.add_quick(ap)
    bench_args.add_postgres(ap)
    bench_args.add_dir(ap)
    ap.add_argument("--no-peers", action="store_true", help="leave huey and procrastinate out")


def say(text: str) -> None:
    print(f"  {text}", file=sys.stderr, flush=True)


@contextmanager
def trees(rev: str) -> Iterator[dict[str, Path]]:
    """{"now": this checkout} and, with ``rev``, {"before": a temporary worktree of it}."""
    if not rev:
        yield {"now": ROOT}
        return
    work = Path(tempfile.mkdtemp(prefix="lk-parts-before-"))
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(work / "tree"), rev],
                   cwd=ROOT, check=True)  # fmt: skip
    try:
        yield {"now": ROOT, "before": work / "tree"}
    finally:
        done = subprocess.run(["git", "worktree", "remove", "--force", str(work / "tree")],
                              cwd=ROOT, check=False)  # fmt: skip
        if done.returncode != 0:
            subprocess.run(["git", "worktree", "prune"], cwd=ROOT, check=False)
        shutil.rmtree(work, ignore_errors=True)


def side(tree: Path, kind: str, **arguments: Any) -> dict[str, float]:
    """One measurement (scripts/bench_side.py) with ``tree``'s code."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(HERE)])}
    done = subprocess.run([sys.executable, str(HERE / "bench_side.py"), kind,
                           json.dumps(arguments)], cwd=HERE, env=env, stdout=subprocess.PIPE,
                          text=True, timeout=1800, check=False)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{kind} with {tree}: exit {done.returncode}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


Side = tuple[str, Callable[[], float]]


def rounds(figures: Figures, count: int, sides: list[Side], unit: str = "/s") -> None:
    """``count`` rounds of ``sides``, the order reversed every other round."""
    for r in range(count):
        for key, fn in sides if r % 2 == 0 else sides[::-1]:
            value = fn()
            figures.setdefault(key, []).append(value)
            say(f"round {r + 1}: {key:<36} {value:10,.2f} {unit}")


# -- the parts ---------------------------------------------------------------------------------
COMMANDS = ("--version", "--help", "enqueue", "show", "signal", "cancel", "retry")


def part_cli(figures: Figures, named: dict[str, Path], tmp: str, n: int) -> None:
    sv = [sys.executable, "-m", "supervisor"]
    commands: dict[str, tuple[list[str], str]] = {"python -c pass": (
        [sys.executable, "-c", "pass"], str(ROOT))}  # fmt: skip
    for name, tree in named.items():
        db = os.path.join(tmp, f"cli-{name}.db")
        env = bench_cli._env(str(tree))
        # (in tmp: ``-m`` puts the working directory, this checkout, before the tree's code)
        subprocess.run([*sv, "migrate", "--db", db], env=env, check=True, capture_output=True,
                       cwd=tmp)  # fmt: skip
        made = subprocess.run([*sv, "enqueue", "noop", "--db", db], env=env, check=True,
                              capture_output=True, text=True, cwd=tmp)  # fmt: skip
        run_id = made.stdout.split()[-1]
        argv = {"--version": ["--version"], "--help": ["--help"],
                "enqueue": ["enqueue", "noop", "--db", db], "show": ["show", run_id, "--db", db],
                "signal": ["signal", run_id, "go", "--db", db],
                "cancel": ["cancel", "999999999", "--db", db],
                "retry": ["retry", "999999999", "--db", db]}  # fmt: skip
        for command in COMMANDS:
            commands[f"{name} cli {command}"] = ([*sv, *argv[command]], str(tree))
    for argv, tree in commands.values():  # the bytecode caches, written once
        bench_cli._timed(argv, tmp, tree=tree)
    sides = [(key, lambda a=argv, t=tree: bench_cli._timed(a, tmp, tree=t) * 1000)
             for key, (argv, tree) in commands.items()]  # fmt: skip
    rounds(figures, n, sides, "ms")


def part_startup(figures: Figures, named: dict[str, Path], tmp: str, n: int) -> None:
    sv = [sys.executable, "-m", "supervisor"]
    for k in range(n):
        for name, tree in list(named.items())[:: 1 - 2 * (k % 2)]:
            took, _, first = bench_cli._drain(sv, os.path.join(tmp, f"up-{name}-{k}.db"),
                                              str(tree))  # fmt: skip
            figures.setdefault(f"{name} start --drain", []).append(took * 1000)
            figures.setdefault(f"{name} first claim", []).append(first * 1000)
            say(f"{k + 1}: {name} start --drain {took * 1000:.0f} ms, first claim "
                f"{first * 1000:.0f} ms")  # fmt: skip


def peer(args: Any, name: str) -> bool:
    """Whether the peer ``name`` (huey, procrastinate: the bench extra) runs beside us."""
    if args.no_peers:
        return False
    try:
        __import__(name)
    except ImportError:
        say(f"{name} is not installed (the bench extra): its rows are not measured")
        return False
    return True


def part_noop(figures: Figures, named: dict[str, Path], tmp: str, args: Any) -> None:
    m = args.noop_tasks
    sides: list[Side] = []
    for w in (2, 8):
        sides += [(f"{name} -n {w}", lambda t=tree, w=w: side(
            t, "noop", m=m, shape=["-n", str(w)], dir=tmp)["rate"])
            for name, tree in named.items()]  # fmt: skip
    if peer(args, "huey"):
        from bench_throughput import huey  # noqa: PLC0415 - imports huey's plumbing

        sides.append(("huey -w 8", lambda: huey(tmp, m, 8)))
    rounds(figures, args.noop_rounds, sides)


def part_slots(figures: Figures, named: dict[str, Path], tmp: str, args: Any) -> None:
    from bench_raw import raw  # noqa: PLC0415

    m = args.slots_tasks
    shape = ["-n", "2", "--concurrency", "16"]

    def slots(name: str, tree: Path) -> float:
        got = side(tree, "noop", m=m, shape=shape, dir=tmp)
        figures.setdefault(f"{name} -n 2 -c 16 cpu us", []).append(got["cpu_us"])
        return got["rate"]

    sides: list[Side] = [(f"{name} -n 2 -c 16", lambda n=name, t=tree: slots(n, t))
                         for name, tree in named.items()]  # fmt: skip
    sides.insert(1, ("bare batched loop", lambda: raw(tmp, m, 2, k=8)))
    rounds(figures, args.slots_rounds, sides)
    io_shape = ["-n", "2", "--concurrency", "250"]
    sides = [(f"{name} io", lambda t=tree: side(t, "io", runs=args.io_runs, dir=tmp,
              seconds=args.io_seconds, shape=io_shape)["seconds"])
             for name, tree in named.items()]  # fmt: skip
    if peer(args, "huey"):
        from bench_slots import huey_io  # noqa: PLC0415

        sides.append(("huey io", lambda: huey_io(tmp, args.io_runs, args.io_seconds)))
    rounds(figures, max(1, args.slots_rounds - 1), sides, "s")


def backends(args: Any) -> list[str]:
    return ["sqlite"] + (["postgres"] if args.postgres else [])


def part_limits(figures: Figures, named: dict[str, Path], tmp: str, args: Any) -> None:
    for backend in backends(args):
        sides: list[Side] = []
        for name, tree in named.items():
            for limited in (False, True):
                what = "limited" if limited else "plain"
                sides.append((f"{name} {backend} {what}", lambda t=tree, lim=limited, b=backend:
                              side(t, "limits", backend=b, server=args.postgres, dir=tmp,
                                   m=args.limits_tasks, workers=2,
                                   limited=lim)["rate"]))  # fmt: skip
        rounds(figures, args.limits_rounds, sides)
        for name, tree in named.items():
            got = side(tree, "claim", backend=backend, server=args.postgres, dir=tmp,
                       keys=args.keys, waiting=args.waiting, samples=args.claims)  # fmt: skip
            for key, value in got.items():
                figures[f"{name} {backend} claim {key}"] = [value]
            say(f"{name} {backend} claim of 16: {got}")


def part_pg(figures: Figures, named: dict[str, Path], tmp: str, args: Any) -> None:
    if not args.postgres:
        return
    for r in range(args.pg_rounds):
        for name, tree in list(named.items())[:: 1 - 2 * (r % 2)]:
            got = side(tree, "pg", server=args.postgres, m=args.pg_tasks, workers=4,
                       concurrency=8, dir=tmp)  # fmt: skip
            figures.setdefault(f"{name} pg rate", []).append(got["rate"])
            figures.setdefault(f"{name} pg server us", []).append(got["server_us"])
            say(f"round {r + 1}: {name} PostgreSQL -n 4 -c 8 {got['rate']:,.0f} /s, "
                f"{got['server_us']:.0f} us of server CPU a run")  # fmt: skip
    if peer(args, "procrastinate"):
        import bench_pg  # noqa: PLC0415

        with bench_pg.bench_database(args.postgres) as database:
            rate = bench_pg.procrastinate(database, args.pg_tasks, 4)
        figures["procrastinate -w 4"] = [rate]


def part_webhooks(figures: Figures, named: dict[str, Path], tmp: str, args: Any) -> None:
    # A catch-up lasts a second or two, so one sample moved 3x between runs of the same tree
    # (922 to 3,042 events/s on a quiet machine): rounds, the trees' order reversed each time.
    for backend in backends(args):
        for r in range(args.hook_rounds):
            for name, tree in list(named.items())[:: 1 - 2 * (r % 2)]:
                got = side(tree, "webhooks", backend=backend, server=args.postgres, dir=tmp,
                           runs=args.hook_runs, trickle=args.trickle)  # fmt: skip
                for key in ("deliveries_per_s", "catch_up_per_s", "lag_p99_ms"):
                    figures.setdefault(f"{name} {backend} hooks {key}", []).append(got[key])
                say(f"round {r + 1}: {name} {backend} webhooks: {got}")


def run(args: argparse.Namespace) -> int:
    parts = [p for p in args.parts.split(",") if p]
    unknown = set(parts) - set(PARTS)
    if unknown:
        args.parser.error(f"--parts: unknown {', '.join(sorted(unknown))}")
    for name, (full, quick) in SIZES.items():
        setattr(args, name, quick if args.quick else full)
    figures: Figures = {}
    started = time.monotonic()
    load = os.getloadavg()
    with (
        trees(args.before) as named,
        tempfile.TemporaryDirectory(prefix="lk-parts-", dir=args.dir) as tmp,
    ):
        for part in parts:
            say(f"{part} ...")
            if part == "cli":
                part_cli(figures, named, tmp, args.cli_samples)
            elif part == "startup":
                part_startup(figures, named, tmp, args.drains)
            else:
                {"noop": part_noop, "slots": part_slots, "limits": part_limits, "pg": part_pg,
                 "webhooks": part_webhooks}[part](figures, named, tmp, args)  # fmt: skip
    elapsed = time.monotonic() - started
    before = args.before or "-"
    print(f"\nscripts/bench --parts {','.join(parts)} --before {before}"
          f"{' --quick (sizes for a smoke run: not figures)' if args.quick else ''}: "
          f"{elapsed / 60:.1f} min; load average {load[0]:.2f} at the start, "
          f"{os.getloadavg()[0]:.2f} at the end; medians of each side's rounds\n")  # fmt: skip
    print_goals(figures, parts, args)
    return 0


def median(values: list[float]) -> float:
    return statistics.median(values)
