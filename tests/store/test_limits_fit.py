"""A token reservation that can never fit (B12): a task whose ``tokens=`` is above a
limit's token bucket (``token_burst``) is refused where it is declared (``@app.task`` against
``app.limit``, in either order), said when a worker declares its limits, and, when the numbers
change at run time (``limits set``, another host), fails its run at claim with reason
``reservation_too_large`` instead of closing its line for good; a cancelled run that waited at
the head of its line reopens it. In the store on both backends, with the fake clock, and in a
real pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pg_session
import pytest
from click.testing import CliRunner
from helpers import FakeClock
from sv_harness import env_with_tests

from supervisor.commands.cli import cli
from workerproc import App
from workerproc.store import ClaimRequest, Store, TaskOptions, open_store
from workerproc.store.limits import TOO_LARGE, LimitSpec

TTL = 30.0
LLM = LimitSpec.declare("llm", tokens="100/m")  # its bucket holds 100 tokens at most


def declare(s: Store, big: int, small: int = 10, spec: LimitSpec = LLM) -> list[str]:
    s.register_tasks({"big": TaskOptions(limits=("llm",), tokens=big),
                      "small": TaskOptions(limits=("llm",), tokens=small)})  # fmt: skip
    return s.declare_limits({"llm": spec}, by="here")


class TestDeclared:
    def test_a_task_above_the_bucket_is_refused_in_either_order(self) -> None:
        app = App()
        app.limit("llm", tokens="100/m")
        with pytest.raises(ValueError, match=r"'big'.*2000 tokens.*'llm'.*token_burst 100"):
            app.task("big", limits=["llm"], tokens=2000)(lambda ctx: None)
        app.task("fits", limits=["llm"], tokens=100)(lambda ctx: None)  # the whole bucket fits
        later = App()
        later.task("big", limits=["llm"], tokens=2000)(lambda ctx: None)
        with pytest.raises(ValueError, match=r"app.limit\('llm'\).*'big' reserves 2000"):
            later.limit("llm", tokens="100/m")
        later.limit("llm", tokens="100/m", token_burst=2000)  # a bucket that holds it

    def test_declaring_limits_says_which_tasks_can_never_fit(self, s: Store) -> None:
        (told,) = declare(s, big=2000)
        assert "'big' reserves 2000 tokens" in told and "token_burst 100" in told
        assert declare(s, big=100) == []  # fits: nothing to say


class TestAtClaim:
    def test_a_run_that_can_never_fit_fails_and_the_line_runs(self, s: Store) -> None:
        """The first reproduction: ``tokens="100/m"``, a run reserving 2,000 first, then 5
        reserving 10: all 5 run, the big one fails with its reason, no line stays closed."""
        declare(s, big=2000)
        big = s.start_run("big", {})
        small = [s.start_run("small", {}) for _ in range(5)]
        out = s.commit_many([], claim=ClaimRequest("w", TTL, 3, 10))
        assert sorted(lease.run_id for lease in out.leases) == small
        run = s.get_run(big)
        assert run is not None and (run.status, run.failure_reason) == ("failed", TOO_LARGE)
        assert "'big' reserves 2000 tokens" in (run.last_error or "")
        (failure,) = out.failed  # the worker's warning line names the run, task and reason
        assert (failure.run_id, failure.task, failure.reason) == (big, "big", TOO_LARGE)
        kinds = [e.kind for e in s.events(after=0, limit=1000) if e.run_id == big]
        assert kinds[-1] == "run.failed"

    def test_limits_set_below_a_reservation_fails_waiting_runs_and_a_lapsed_one(
        self, s: Store, clock: FakeClock
    ) -> None:
        assert declare(s, big=500, spec=LimitSpec.declare("llm", tokens="1000/m")) == []
        lapsed = s.start_run("big", {})
        (held,) = s.claim("dead", TTL, limit=1)  # reserves 500; its worker dies
        assert held.run_id == lapsed and held.reserved == 500
        waiting = s.start_run("big", {})
        small = s.start_run("small", {})
        s.set_limit("llm", token_burst=100)  # an operator shrinks the bucket at run time
        clock.advance(TTL + 1)
        got = s.claim("w", TTL, limit=10)
        assert [lease.run_id for lease in got] == [small]
        for run_id in (lapsed, waiting):
            run = s.get_run(run_id)
            assert run is not None and (run.status, run.failure_reason) == ("failed", TOO_LARGE)
        (task,) = s.get_tasks(lapsed)
        assert task.lease_owner is None  # the lapsed lease went with its run

    def test_cancelling_the_run_at_the_head_reopens_its_line(
        self, s: Store, clock: FakeClock
    ) -> None:
        declare(s, big=90)  # fits the bucket, but not what is left of it
        first = s.start_run("small", {}, key="first")
        assert [x.run_id for x in s.claim("w", TTL, limit=1)] == [first]  # 90 left
        s.start_run("small", {}, key="second")
        assert len(s.claim("w", TTL, limit=1)) == 1  # 80 left
        blocker = s.start_run("big", {})  # 90 > 80: the line closes until the bucket refills
        small = [s.start_run("small", {}, key=f"s{i}") for i in range(3)]
        assert s.claim("w", TTL, limit=10) == []
        clock.advance(0.5)
        assert s.claim("w", TTL, limit=10) == []  # closed for about 6 s more
        assert s.cancel_run(blocker)
        got = s.claim("w", TTL, limit=10)
        assert sorted(lease.run_id for lease in got) == small  # at once: 80 tokens are left


def test_limits_set_warns_of_tasks_whose_runs_will_fail(tmp_path: Path) -> None:
    db = str(tmp_path / "lk.db")
    with open_store(db) as s:
        assert declare(s, big=500, spec=LimitSpec.declare("llm", tokens="1000/m")) == []
    clean = {k: None for k in os.environ if k.startswith("SUPERVISOR_")}
    result = CliRunner().invoke(cli, ["limits", "set", "llm", "--db", db, "--token-burst", "100"],
                                env=clean)  # type: ignore[arg-type]  # fmt: skip
    assert result.exit_code == 0, result.output
    (warning,) = result.stderr.splitlines()
    assert "'big' reserves 500 tokens" in warning and TOO_LARGE in warning


APP = """
from workerproc import App

app = App()
app.limit("llm", tokens="100/m", token_burst=1000)


@app.task(limits=["llm"], tokens=500)
def call(ctx):
    ctx.finish({}, result="ok")


@app.task(limits=["llm"], tokens=5)
def small(ctx):
    ctx.finish({}, result="ok")
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_pool_fails_the_run_that_cannot_fit_and_drains_the_rest(
    backend: str, tmp_path: Path
) -> None:
    """A real pool: the operator shrank the bucket below a task's reservation; the worker says
    so when it starts, fails that task's run at claim (one warning line), runs the others and
    the drain ends (16: a run failed)."""
    (tmp_path / "fitapp.py").write_text(APP, encoding="utf-8")
    db = str(tmp_path / "lk.db") if backend == "sqlite" else pg_session.schema_url("fit")
    with open_store(db) as s:
        s.register_tasks({"call": TaskOptions(limits=("llm",), tokens=500),
                          "small": TaskOptions(limits=("llm",), tokens=5)})  # fmt: skip
        s.declare_limits({"llm": LimitSpec.declare("llm", tokens="100/m", token_burst=1000)},
                         by="elsewhere")  # fmt: skip
        s.set_limit("llm", token_burst=100)
        big = s.start_run("call", {})
        small = [s.start_run("small", {}, key=str(i)) for i in range(5)]
    cmd = [sys.executable, "-m", "supervisor", "start", "-n", "1", "--db", db, "--app",
           "fitapp:app", "--drain", "--fail-on-failed", "--log-format", "json"]  # fmt: skip
    done = subprocess.run(cmd, env=env_with_tests(str(tmp_path)), cwd=tmp_path, text=True,
                          capture_output=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 16, done.stderr  # a run failed during the drain
    said = [json.loads(line) for line in done.stderr.splitlines() if TOO_LARGE in line]
    assert {e["event"] for e in said} == {TOO_LARGE, "run_failed"}, done.stderr
    assert all("'call' reserves 500 tokens" in e["msg"] for e in said), said
    with open_store(db) as s:
        run = s.get_run(big)
        assert run is not None and (run.status, run.failure_reason) == ("failed", TOO_LARGE)
        assert {s.get_run(r).status for r in small} == {"succeeded"}  # type: ignore[union-attr]
