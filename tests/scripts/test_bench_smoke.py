"""The benchmarks still run: ``scripts/bench store --quick`` and the slot and I/O-bound parts
of ``scripts/bench throughput --quick`` (without huey: the test extra does not install it) exit 0
and print their tables. Speed is the benchmarks' business, not this test's: no goal is asserted
here, only that each part measured something."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
@pytest.mark.e2e  # (half a minute: scripts/test-e2e runs it)
def test_bench_store_quick_prints_the_table(tmp_path: object) -> None:
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "store", "--quick",
         "--dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "| measurement | result | goal | notes |" in out
    for row in ("claim+ack throughput, 8 processes", "latency ratio", "hot-run slowdown",
                "write-lock wait, 8 processes", "| process | claim+ack done |",
                "| claim latency, 20,000 pending tasks in 10 queues |",
                "| claim latency ratio 20,000 / 1,000 in 10 queues (p50) |",
                "| batched claim (limit=8) latency, 20,000 pending tasks in 10 queues |",
                "| start_runs of 10,000 runs, one transaction |",
                "| start_runs of 10,000 runs, one transaction, a key each |",
                "| enqueue latency, 4 producers (one run per transaction) while -n 8 drains |",
                "| enqueue latency, 4 producers (one run per transaction) while -n 8 --prefetch "
                "8 drains |",
                "| enqueue p99, worst of 4 producers |"):  # fmt: skip
        assert row in out, f"missing {row!r} in:\n{out}"
    enqueued = re.search(
        r"\| \.\.\. enqueued / drained meanwhile .*? \| ([\d,]+) / ([\d,]+) runs", out
    )
    assert enqueued, out
    assert all(int(n.replace(",", "")) > 0 for n in enqueued.groups()), enqueued.group(0)
    assert os.listdir(str(tmp_path)) == [], "the benchmark leaves no databases behind"


@pytest.mark.slow
def test_bench_web_smoke_prints_both_rows(tmp_path: object) -> None:
    """``scripts/bench web`` still drains with and without a busy dashboard."""
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "web", "--runs", "200",
         "--workers", "1", "--rounds", "1", "--dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    for row in ("| without a dashboard |", "| with 3 pages loaded every second |", "| ratio |"):
        assert row in proc.stdout, proc.stdout
    assert os.listdir(str(tmp_path)) == [], "the benchmark leaves no databases behind"


def _cells(out: str, row: str) -> list[str]:
    """The cells of the markdown row that starts with ``row``."""
    line = next((x for x in out.splitlines() if x.startswith(f"| {row} |")), None)
    assert line is not None, f"missing row {row!r} in:\n{out}"
    return [cell.strip() for cell in line.strip("|").split("|")]


@pytest.mark.slow
@pytest.mark.e2e  # (some 40 processes, each timed: scripts/test-e2e runs it)
@pytest.mark.timeout(600)
def test_bench_cli_times_every_command_and_a_one_run_pool() -> None:
    """``scripts/bench cli``: a row per one-run command with its verdict against the goal,
    the interpreter's own start beside them, the one-run pool's drain, the module counts."""
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "cli", "--samples", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    for row in ("--version", "--help", "enqueue", "show", "signal", "cancel", "retry",
                "start -n 2 --drain, one run"):  # fmt: skip
        p50, p90, goal, verdict = _cells(proc.stdout, row)[1:5]
        assert 0 < float(p50) <= float(p90) and float(goal) > 0, (row, p50, p90)
        assert verdict in ("met", "**NOT met**"), row
    assert float(_cells(proc.stdout, "python -c pass")[1]) > 0
    counts = dict(re.findall(r"^  (\S+): (\d+) modules$", proc.stdout, re.MULTILINE))
    assert set(counts) == {"--version", "--help", "show", "signal"}, proc.stdout
    # --help lists the commands from their one-line help: it imports none of their modules,
    # so it loads fewer than a command that opens the store
    assert int(counts["--version"]) <= int(counts["--help"]) < int(counts["signal"])


@pytest.mark.slow
def test_bench_slots_and_io_quick_print_their_tables(tmp_path: object) -> None:
    """Ours with slots, the raw batched ceiling, sync and async I/O-bound runs at 250 slots with
    the workers' RSS, and the goals table, on small sizes."""
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "throughput", "--quick",
         "--no-huey", "--parts", "slots,io", "--workers", "2", "--tasks", "300", "--io-runs", "200",
         "--io-seconds", "0.2", "--dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=110, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    for shape in ("-n 2 --concurrency 16", "-n 8 --concurrency 4"):
        ours, _huey, fused, batched = _cells(out, shape)[1:5]
        assert all(float(x.replace(",", "")) > 0 for x in (ours, fused, batched)), shape
    for mode in ("sync handler (time.sleep)", "async handler (asyncio.sleep)"):
        cells = _cells(out, mode)
        assert float(cells[1]) > 0.2, cells  # the run takes at least one call's length
        assert float(cells[4]) > 5, cells  # a worker's peak RSS (MB) was sampled
    goals = ["No-op, slots: >= 3x huey -w 2 and >= 1.5x the one-transaction raw ceiling",
             "One slot per worker, -n 2: >= 1.2x huey -w 2",
             "I/O-bound at 500 slots: no slower than huey with 500 thread workers",
             "Worker RSS at 250 slots <= 120 MB",
             "Idle pickup and takeover: no worse than today"]  # fmt: skip
    verdicts = {goal: _cells(out, goal)[-1] for goal in goals}
    assert verdicts[goals[3]] in ("met", "**NOT met**"), verdicts
    assert {v for g, v in verdicts.items() if g != goals[3]} == {"not measured"}, verdicts
    assert os.listdir(str(tmp_path)) == [], "the benchmark leaves no databases behind"


def _before_trees(commit: str) -> list[str]:
    """The worktrees ``scripts/bench before`` made (``lk-before-*``) that hold ``commit``: the
    two tests below may run side by side (xdist), each on a commit of its own."""
    listed = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    entries = [dict(line.split(" ", 1) for line in entry.splitlines() if " " in line)
               for entry in listed.split("\n\n")]  # fmt: skip
    return [entry["worktree"] for entry in entries
            if "/lk-before-" in entry.get("worktree", "")
            and entry.get("HEAD", "").startswith(commit)]  # fmt: skip


@pytest.mark.e2e
@pytest.mark.slow
def test_bench_before_measures_both_trees_and_removes_its_worktree() -> None:
    """``scripts/bench before`` (the bench's --before) runs the earlier commit's pool beside
    this one and prints both; its temporary worktree is gone afterwards."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from bench_before import BASELINE, exists  # noqa: PLC0415 - a script's module

    if not exists(BASELINE):
        pytest.skip(f"a shallow clone: no commit {BASELINE} to compare with")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "before", BASELINE,
         "--samples", "2", "--trials", "1", "--rounds", "1", "--tasks", "300"],
        cwd=ROOT, capture_output=True, text=True, timeout=170, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    for row in ("idle pickup, -n 8", "takeover after SIGKILL, fast release"):
        before, now = _cells(proc.stdout, row)[1:3]
        for cell in (before, now):
            p50, p99 = (float(x) for x in cell.split(" / "))
            assert 0 < p50 <= p99, (row, cell)
    before, now = _cells(proc.stdout, "-n 8")[1:3]  # no-op runs/s of each tree
    assert float(before.replace(",", "")) > 0 and float(now.replace(",", "")) > 0
    assert _before_trees(BASELINE) == [], "the run's worktree was removed"


PRE_REDESIGN = "26f0342"  # the baseline: the last commit before the store was rewritten


@pytest.mark.e2e
@pytest.mark.slow
def test_bench_before_on_postgres_measures_both_trees_and_drops_their_databases() -> None:
    """``bench_before.py --backend postgres``: each tree drains and picks up on a database of
    its own on the server, made for the run; both trees' figures are printed, and their
    databases are gone afterwards."""
    import pg_session  # noqa: PLC0415 - skips loudly without a server
    import psycopg  # noqa: PLC0415

    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from bench_before import exists  # noqa: PLC0415 - a script's module

    pg_session.database_url()
    if not exists(PRE_REDESIGN):
        pytest.skip(f"a shallow clone: no commit {PRE_REDESIGN} to compare with")

    def ours() -> set[str]:
        with psycopg.connect(pg_session.ADMIN_URL, autocommit=True) as conn:
            rows = conn.execute("SELECT datname FROM pg_database").fetchall()
        return {name for (name,) in rows if name.startswith("lk_before_")}

    already = ours()
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "before", PRE_REDESIGN,
         "--backend", "postgres", "--server", pg_session.ADMIN_URL, "--samples", "2",
         "--rounds", "0", "--tasks", "200"],
        cwd=ROOT, capture_output=True, text=True, timeout=170, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    before, now = _cells(proc.stdout, "idle pickup, -n 8")[1:3]
    for cell in (before, now):
        p50, p99 = (float(x) for x in cell.split(" / "))
        assert 0 < p50 <= p99, cell
    assert "postgres: no-op runs/s" in proc.stdout
    for shape in ("-n 8", "-n 2 --concurrency 16"):
        before, now = _cells(proc.stdout, shape)[1:3]
        assert float(before.replace(",", "")) > 0 and float(now.replace(",", "")) > 0
    assert "takeover" not in proc.stdout  # SQLite only: the old trees' script speaks SQLite
    assert ours() <= already, "the run's databases were dropped"
    assert _before_trees(PRE_REDESIGN) == [], "the run's worktree was removed"


@pytest.mark.slow
def test_bench_pg_pickup_and_its_raw_floor_measure_each_sample() -> None:
    """``bench_pg``'s idle pickup (a supervisor of 8 on PostgreSQL) and the raw floor it is
    printed beside (a bare producer, LISTEN and one-statement claim) return one figure per gap;
    the floor's table is dropped afterwards."""
    import psycopg  # noqa: PLC0415 - the test extra has it; pg_session skips loudly without
    from pg_session import database_url  # noqa: PLC0415 - skips without a server

    database = database_url()
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from bench_pg import pickup  # noqa: PLC0415 - a script's module
    from bench_pg_floor import raw_pickup  # noqa: PLC0415 - a script's module

    commits, floor = raw_pickup(database, [0.2, 0.3])
    assert len(commits) == len(floor) == 2
    assert min(commits + floor) > 0, (commits, floor)  # the claim may beat the commit's reply
    with psycopg.connect(database, autocommit=True) as conn:
        left = conn.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'pickup_floor_%'")
        assert left.fetchone() == (0,)
    enqueues, ours = pickup(database, 2, [0.2, 0.3])
    assert len(enqueues) == len(ours) == 2
    assert min(enqueues + ours) > 0, (enqueues, ours)


@pytest.mark.slow
def test_bench_pg_throughput_and_cost_rows_drain_every_run() -> None:
    """``bench_pg``'s throughput side drains its bulk-written runs (they carry their claim
    columns: no trigger fills them since schema v9, and a drain of unclaimable runs never
    ended), and the cost rows (``bench_pg_cost``) measure a drain that leaves at most one dead
    row version per run and per task."""
    from pg_session import database_url  # noqa: PLC0415 - skips without a server

    database = database_url()
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from bench_pg import cost_rows, ours  # noqa: PLC0415 - a script's module

    assert ours(database, 300, 2, 1) > 0  # raises unless all 300 succeeded
    lines = cost_rows(database, 300)
    dead = [float(re.search(r"\| ([0-9.]+) \(HOT", line)[1]) for line in lines  # type: ignore[index]
            if line.startswith("| dead row versions")]  # fmt: skip
    assert len(dead) == 2 and max(dead) <= 1.05, lines


def test_bench_limits_quick_prints_its_rows(tmp_path: object) -> None:
    """``scripts/bench limits --quick`` (SQLite: PostgreSQL's rows are the same code) still
    drains with and without a limit and times the gated claim."""
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "limits", "--quick",
         "--postgres", "", "--tasks", "100", "--dir", str(tmp_path)],
        cwd=os.path.join(ROOT, "scripts"), capture_output=True, text=True, timeout=240,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "sqlite: no-op throughput, -n 2, 100 runs, a limit that never binds" in out, out
    assert "sqlite: a batched claim of 16, 200 keys of one limit, 2,000 runs waiting" in out, out
    assert os.listdir(str(tmp_path)) == [], "the benchmark leaves no databases behind"


def test_bench_webhooks_quick_prints_its_rows() -> None:
    """``scripts/bench webhooks --quick`` (SQLite) still delivers every run's success to its
    receiver, times the trickle and a webhook catching up."""
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "webhooks", "--quick",
         "--postgres", ""],
        cwd=os.path.join(ROOT, "scripts"), capture_output=True, text=True, timeout=240,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r"^\| SQLite \| [0-9.]+ \| [0-9.]+ \| [0-9,]+ \| [0-9.]+ / [0-9.]+ "
                     r"\| [0-9,]+ \|$", proc.stdout, re.M), proc.stdout  # fmt: skip


@pytest.mark.slow
@pytest.mark.e2e  # (two pools, each measured: scripts/test-e2e runs it)
@pytest.mark.timeout(600)
def test_bench_idle_quick_prints_cpu_per_process_and_memory() -> None:
    """``scripts/bench idle --quick``: a row per process of the idle pool with its CPU share,
    its wake-ups and the load beside, a verdict for each worker, and the memory rows."""
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "idle", "--quick",
         "--postgres", ""],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| SQLite |")]
    assert [r.split("|")[2].split()[0] for r in rows] == ["supervisor", "worker", "worker"]
    for row in rows:
        cpu, wakes, rss, load = (float(c) for c in row.strip("|").split("|")[2:6])
        assert cpu >= 0 and wakes >= 0 and rss > 0 and load >= 0, row
    for row in ("supervisor, -n 8", "largest worker, one slot"):
        rss, uss, goal, verdict = _cells(proc.stdout, row)[1:5]
        assert 0 < float(uss) <= float(rss) and goal.startswith("<= "), row
        assert verdict in ("met", "**NOT met**"), row
