"""scripts/simulate: 500 seeds pass, every mutant is caught by the seed known to catch it, a
seed replays byte for byte, and the CLI's one-line errors."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "simulate.py"
sys.path.insert(0, str(ROOT / "scripts"))

from sim import cli  # noqa: E402 - the simulator is a package of scripts/
from sim.mutants import MUTANTS  # noqa: E402

# each mutant, a seed that catches it and the invariant it breaks there (scripts/simulate
# --seeds 2000 --mutant NAME prints the first; .ci/run runs those)
CAUGHT = {
    "fence-off": (12, "no write by a non-holder"),
    "renew-expired": (21, "at most one live holder per task"),
    "start-early": (0, "no handler started on a lease not confirmed"),
    "gate-drift": (84, "limit counters equal a recount"),
    "keep-late": (0, "a kept answer is never paid again"),
    "signal-twice": (5, "signals resume once"),
}


def simulate(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)  # fmt: skip


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[None]:
    """The simulator's own process state, in this process: its store, and the logging it
    silences (the workers' lines), given back afterwards so no later test runs without logs."""
    cli._init("sqlite", None, str(tmp_path), "unused")
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
        assert cli._backend is not None
        cli._backend.close()


def test_five_hundred_seeds_pass() -> None:
    """A short run of the real command (CI runs thousands of seeds after the suite)."""
    out = simulate("--seeds", "500", "--jobs", "2", timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "seeds 0..499: no invariant broken" in out.stdout


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_every_mutant_is_caught(backend: None, name: str) -> None:
    seed, invariant = CAUGHT[name]
    cli._mutant = name
    result = cli.play(seed)
    assert result.violation is not None, f"{name} not caught by seed {seed}"
    assert result.violation.name == invariant, result.violation
    cli._mutant = None
    assert cli.play(seed).violation is None  # the same seed passes without the planted bug


def test_a_seed_plays_the_same_twice(backend: None) -> None:
    for seed in (3, 77):
        first, again = cli.play(seed), cli.play(seed)
        assert first.played == again.played
        assert str(first.violation) == str(again.violation)


def test_replay_prints_the_shrunk_schedule_and_the_invariant() -> None:
    first = simulate("--replay", "1", "--mutant", "start-early")
    again = simulate("--replay", "1", "--mutant", "start-early")
    assert first.returncode == 1, first.stderr
    assert first.stdout == again.stdout  # byte for byte
    lines = first.stdout.splitlines()
    assert lines[0].startswith("seed 1: shrunk from 60 actions to ")
    assert lines[-1].startswith("seed 1: no handler started on a lease not confirmed: ")


def test_retry_of_a_cancelled_run_waits_for_its_holders_lease(backend: None) -> None:
    """Seed 2587 (found by the simulator): a retry dropped the live lease of a cancelled run's
    handler, and the new generation began at once; the old holder, not yet told, then paid a
    call the new attempt had kept. The new generation now begins only once the dropped lease
    would have expired (B2), so the seed plays through with no payment after a kept answer."""
    sim = cli.Simulation(2587, cli._backend.open)  # type: ignore[union-attr]
    result = sim.play(cli.draw(2587))
    assert result.violation is None
    assert sim.ledger.dropped, "the seed no longer retries a run under a live lease"
    late = [
        (key, p.attempt)
        for key, pays in sim.ledger.payments.items()
        for i, p in enumerate(pays)
        if any(q.state in ("kept", "used") for q in pays[:i])
    ]
    assert not late, f"paid after a kept answer: {late}"


def test_list_mutants_and_bad_arguments() -> None:
    listed = simulate("--list-mutants")
    assert listed.returncode == 0
    assert [line.split()[0] for line in listed.stdout.splitlines()] == list(MUTANTS)
    bad = simulate("--seeds", "0")
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    unknown = simulate("--mutant", "nope")
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
