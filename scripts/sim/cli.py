"""``scripts/simulate``: run schedules by seed, replay one, list the mutants.

    scripts/simulate --seeds 5000 [--seed S] [--minutes M] [--backend sqlite|postgres]
                     [--mutant NAME] [--jobs J]
    scripts/simulate --replay S [--mutant NAME] [--backend ...]
    scripts/simulate --list-mutants

``--seeds N`` plays seeds S .. S+N-1 (S: ``--seed``, 0 by default) on ``--jobs`` processes (2);
``--minutes M`` stops starting seeds after M minutes of wall time (the only wall clock read,
and never inside a schedule). Without a mutant, any violation fails (exit 1) and its seed is
printed with its shrunk schedule. With ``--mutant``, the run stops at the first seed that
catches it (exit 0, the seed printed); a mutant no seed catches fails (exit 1).
``--replay S`` plays seed S alone, shrinks its schedule if it fails, and prints the schedule
and the invariant it broke.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import sys
import time
from collections.abc import Iterator

from . import checks
from .backends import Backend, backend, clean, scratch, tag
from .mutants import MUTANTS
from .run import Action, Result, Simulation, draw

_backend: Backend | None = None
_mutant: str | None = None


def _init(backend_name: str, mutant: str | None, root: str, prefix: str) -> None:
    global _backend, _mutant
    logging.disable(logging.CRITICAL)  # the workers' own log lines: the verdict says it all
    _backend = backend(backend_name, root, prefix)
    _mutant = mutant


def play(seed: int, actions: list[Action] | None = None) -> Result:
    assert _backend is not None
    m = MUTANTS[_mutant] if _mutant else None
    sim = Simulation(seed, _backend.open, worker_class=m.worker if m else Simulation.worker_default,
                     store_class=m.store if m else Simulation.store_default)  # fmt: skip
    return sim.play(draw(seed) if actions is None else actions)


def verdict(seed: int) -> tuple[int, str | None]:
    result = play(seed)
    return seed, None if result.violation is None else str(result.violation)


def shrink(seed: int, name: str) -> tuple[list[Action], Result]:
    """The shortest schedule found (chunks removed while the same invariant still breaks)."""
    actions = draw(seed)
    best = play(seed, actions)
    chunk = len(actions) // 2
    while chunk >= 1:
        i, changed = 0, False
        while i < len(actions):
            trial = actions[:i] + actions[i + chunk :]
            result = play(seed, trial)
            if result.violation is not None and result.violation.name == name:
                actions, best, changed = trial, result, True
            else:
                i += chunk
        if not changed:
            chunk //= 2
    return actions, best


def seeds(first: int, count: int, minutes: float | None) -> Iterator[int]:
    deadline = None if minutes is None else time.monotonic() + minutes * 60
    for seed in range(first, first + count):
        if deadline is not None and time.monotonic() > deadline:
            return
        yield seed


def replay(seed: int) -> int:
    first = play(seed)
    if first.violation is None:
        print("\n".join(first.played))
        print(f"seed {seed}: no invariant broken ({len(draw(seed))} actions)")
        return 0
    actions, result = shrink(seed, first.violation.name)
    print(f"seed {seed}: shrunk from {len(draw(seed))} actions to {len(actions)}:")
    print("\n".join(result.played))
    print(f"seed {seed}: {result.violation}")
    return 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/simulate", description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=500, help="how many seeds (500)")
    ap.add_argument("--seed", type=int, default=0, help="the first seed (0)")
    ap.add_argument("--minutes", type=float, default=None, help="stop starting seeds after this")
    ap.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    ap.add_argument("--mutant", choices=sorted(MUTANTS), default=None)
    ap.add_argument("--replay", type=int, default=None, metavar="S", help="replay one seed")
    ap.add_argument("--list-mutants", action="store_true")
    ap.add_argument("--jobs", type=int, default=2, help="processes (2)")
    args = ap.parse_args(argv)
    if args.list_mutants:
        for m in MUTANTS.values():
            print(f"{m.name:14} {m.what}")
        return 0
    if args.seeds < 1 or args.jobs < 1:
        print("scripts/simulate: --seeds and --jobs take a whole number from 1", file=sys.stderr)
        return 2
    root, prefix = scratch(), tag()
    try:
        try:
            if args.replay is None:  # the pool's processes open their own
                backend(args.backend, root, prefix).close()  # (fails here, once, if it must)
            else:
                _init(args.backend, args.mutant, root, prefix)
        except Exception as exc:  # no PostgreSQL server, say: one line
            print(f"scripts/simulate: cannot open the {args.backend} backend: {exc}",
                  file=sys.stderr)  # fmt: skip
            return 2
        if args.replay is not None:
            return replay(args.replay)
        return run_many(args, root, prefix)
    finally:
        clean(args.backend, root, prefix)


def run_many(args: argparse.Namespace, root: str, prefix: str) -> int:
    started = time.monotonic()
    done, failed = 0, []
    with multiprocessing.get_context("fork").Pool(
        args.jobs, initializer=_init, initargs=(args.backend, args.mutant, root, prefix)
    ) as pool:
        for seed, violation in pool.imap(verdict, seeds(args.seed, args.seeds, args.minutes),
                                         chunksize=8):  # fmt: skip
            done += 1
            if violation is not None:
                failed.append((seed, violation))
                if args.mutant:
                    pool.terminate()
                    break
    per_minute = done / max(time.monotonic() - started, 1e-9) * 60
    print(
        f"{done} schedules on {args.backend}, {per_minute:.0f} a minute, "
        f"{len(checks.INVARIANTS)} invariants checked after every step"
    )
    if args.mutant:
        if failed:
            seed, violation = failed[0]
            print(f"mutant {args.mutant} caught by seed {seed} ({done} seeds): {violation}")
            return 0
        print(f"mutant {args.mutant} NOT caught in {done} seeds", file=sys.stderr)
        return 1
    if not failed:
        print(f"seeds {args.seed}..{args.seed + done - 1}: no invariant broken")
        return 0
    seed, violation = failed[0]
    print(
        f"seed {seed}: {violation} ({len(failed)} seed(s) failed: "
        f"{' '.join(str(s) for s, _ in failed[:20])})",
        file=sys.stderr,
    )
    _init(args.backend, args.mutant, root, prefix)
    replay(seed)
    print(
        f"replay: scripts/simulate --replay {seed}"
        + (f" --backend {args.backend}" if args.backend != "sqlite" else ""),
        file=sys.stderr,
    )
    return 1
