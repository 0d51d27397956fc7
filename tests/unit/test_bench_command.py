"""``scripts/bench`` is one command: ``scripts/bench.py`` lists every benchmark as a subcommand,
shows each one's own options, and refuses a name it does not know (usage, exit 2). The benchmarks
themselves run in ``tests/scripts/test_bench_smoke.py`` and
``tests/scripts/test_bench_once.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import bench  # noqa: E402 - a script's module, found beside it

# an option only that benchmark has, so its help is its own
OWN_OPTION = {"throughput": "--only-postgres", "before": "--now", "store": "--quick",
              "once": "--work-ms", "limits": "--keys", "events": "--procs",
              "waits": "--waiting", "webhooks": "--trickle", "web": "--runs",
              "worker": "--ttl", "pg-cost": "--concurrency", "pg-floor": "samples",
              "streams": "--flood", "pgbouncer": "--workers", "cli": "--samples",
              "batch": "--workers", "idle": "--window", "profile": "--top"}  # fmt: skip


def bench_py(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPTS / "bench.py"), *args], cwd=os.getcwd(),
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


def test_every_benchmark_is_a_subcommand() -> None:
    modules = {p.stem for p in SCRIPTS.glob("bench_*.py")}
    assert {module for module, _ in bench.SUBCOMMANDS.values()} <= modules
    assert set(bench.SUBCOMMANDS) == set(OWN_OPTION)
    assert not (SCRIPTS / "bench-once").exists(), "one entry point: scripts/bench once"
    out = bench_py("--help")
    assert out.returncode == 0, out.stderr
    for name in bench.SUBCOMMANDS:
        assert f"    {name}" in out.stdout, out.stdout


@pytest.mark.parametrize("name", sorted(OWN_OPTION))
def test_each_subcommand_has_its_own_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        bench.main([name, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: scripts/bench {name} "), out
    assert OWN_OPTION[name] in out, out


def test_a_subcommand_parses_its_options_and_the_shared_ones() -> None:
    args = bench.parser("limits").parse_args(["limits", "--quick", "--postgres", ""])
    assert (args.subcommand, args.quick, args.postgres, args.dir) == ("limits", True, "", None)
    assert args.run.__module__ == "bench_limits"


def test_an_unknown_or_missing_subcommand_is_a_usage_error() -> None:
    for argv in (["nope"], []):
        out = bench_py(*argv)
        assert out.returncode == 2, out
        assert out.stderr.startswith("usage: scripts/bench "), out.stderr


def test_the_speed_goals_run_is_options_without_a_subcommand(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``scripts/bench --parts ... --before REV``: the speed goals' one command (no subcommand);
    its help names every part and its run time, and a part it does not know is a usage error."""
    with pytest.raises(SystemExit) as exited:
        bench.main(["--parts", "cli", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for part in ("cli", "startup", "noop", "slots", "limits", "pg", "webhooks"):
        assert f"  {part} " in out, out
    assert "--before" in out and "--quick" in out and "35" in out, out
    args = bench.parts_parser().parse_args(["--parts", "noop,slots", "--before", "a3296d1"])
    assert (args.parts, args.before, args.quick) == ("noop,slots", "a3296d1", False)
    assert args.run.__module__ == "bench_parts"
    out2 = bench_py("--parts", "nope", "--before", "HEAD")
    assert out2.returncode == 2, out2
    assert "unknown nope" in out2.stderr, out2.stderr
