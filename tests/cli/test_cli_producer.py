"""The producer side from the shell: `enqueue --key/--queue/--priority`, `wait` and its exit codes,
`runs --queue`, `status` by queue; and two pools on one database, each serving its own queue."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cli_runner import invoke
from click.testing import CliRunner
from store_backends import fail_run, finish
from sv_harness import Supervisor, env_with_tests

from supervisor import exitcodes
from supervisor.commands.cli import cli
from workerproc.store import open_store


@pytest.fixture
def db(sqlite_db: str) -> str:
    """SQLite only: what these tests pin does not depend on the backend."""
    return sqlite_db


def test_enqueue_with_a_key_a_queue_and_a_priority(db: str) -> None:
    first = invoke("enqueue", "charge", "--db", db, "--key", "order-7", "--queue", "payments",
                   "--priority", "5")  # fmt: skip
    assert first.exit_code == 0, first.output
    again = invoke("enqueue", "charge", "--db", db, "--key", "order-7")
    assert again.stdout == first.stdout  # the same run: nothing new was started
    with open_store(db) as store:
        (run,) = store.list_runs()
        assert (run.key, run.queue, run.priority) == ("order-7", "payments", 5)
    listed = json.loads(invoke("runs", "--db", db, "--queue", "payments", "--json").stdout)
    assert [r["id"] for r in listed] == [run.id]
    assert json.loads(invoke("runs", "--db", db, "--queue", "other", "--json").stdout) == []


TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_enqueue_continues_the_trace_it_is_given(db: str) -> None:
    assert invoke("enqueue", "a", "--db", db, "--traceparent", TRACE).exit_code == 0
    from_env = CliRunner().invoke(cli, ["enqueue", "b", "--db", db], env={"TRACEPARENT": TRACE})
    assert from_env.exit_code == 0, from_env.output
    assert invoke("enqueue", "c", "--db", db).exit_code == 0
    with open_store(db) as store:
        leases = {x.task: x for x in store.claim("w", 30.0, limit=3)}
    assert [leases[t].traceparent for t in "abc"] == [TRACE, TRACE, None]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--priority", "1001"], "--priority must be a number from -1000 to 1000"),
        (["--priority", "high"], "--priority: 'high' is not a whole number"),
        (["--queue", "two words"], "queue must be 1-64 characters"),
        (["--key", "k" * 300], "key must be a string of 1 to 255 characters"),
        (["--traceparent", "00-abc"], "traceparent must be a W3C traceparent"),
    ],
)
def test_enqueue_refuses_bad_run_options(db: str, args: list[str], words: str) -> None:
    result = invoke("enqueue", "t", "--db", db, *args)
    assert result.exit_code == exitcodes.USAGE
    (line,) = result.stderr.strip().splitlines()
    assert words in line and "Traceback" not in result.output
    with open_store(db) as store:
        assert store.list_runs() == []


def test_status_breaks_down_by_queue(db: str) -> None:
    with open_store(db) as store:
        store.start_runs([{"task": "t", "queue": "a"}, {"task": "t", "queue": "b", "delay": 60}])
    doc = json.loads(invoke("status", "--db", db, "--json").stdout)
    assert doc["queues"]["a"]["ready"] == 1 and doc["queues"]["b"]["delayed"] == 1
    text = invoke("status", "--db", db).stdout
    assert "QUEUE" in text and "(all)" in text


@pytest.mark.parametrize(
    ("ending", "code"),
    [("succeeded", exitcodes.OK), ("failed", exitcodes.RUN_FAILED),
     ("cancelled", exitcodes.RUN_CANCELLED)],
)  # fmt: skip
def test_wait_exits_with_how_the_run_ended(db: str, ending: str, code: int) -> None:
    with open_store(db) as store:
        run_id = store.start_run("t")

    def end_soon() -> None:
        time.sleep(0.3)
        with open_store(db) as store:
            if ending == "succeeded":
                lease = store.claim("h:1:1.00:w", 30)
                assert lease is not None
                finish(store, lease, lease.revision, {}, result={"ok": True})
            elif ending == "failed":
                fail_run(store, run_id, "boom", "ValueError: no")
            else:
                store.cancel_run(run_id)

    t = threading.Thread(target=end_soon)
    t.start()
    cmd = [sys.executable, "-m", "supervisor", "wait", str(run_id), "--db", db, "--timeout", "30"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env_with_tests())
    t.join(30)
    assert done.returncode == code, done.stderr
    assert f"run {run_id} {ending}" in done.stdout


def test_wait_times_out_and_refuses_an_unknown_run(db: str) -> None:
    with open_store(db) as store:
        run_id = store.start_run("t")
    result = invoke("wait", str(run_id), "--db", db, "--timeout", "0.2")
    assert result.exit_code == exitcodes.WAIT_TIMEOUT
    assert "still pending" in result.stderr
    missing = invoke("wait", "99", "--db", db, "--timeout", "1")
    assert missing.exit_code == exitcodes.RUN_UNKNOWN and "no run with id 99" in missing.stderr
    # the code a script branches on is in the README's exit-code table, under `wait`
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert f"| {exitcodes.RUN_UNKNOWN} | `wait`: no run has that id" in readme


@pytest.mark.slow
def test_two_pools_each_serve_their_own_queues(tmp_path: Path) -> None:
    """A pool for expensive model calls and a pool for cheap steps share one database: each
    run is executed by a worker of the pool serving its queue, and each pool's --drain ends
    when its own queues are empty (the cheap one long before the model calls finish)."""
    model, cheap = Supervisor(tmp_path, "model"), Supervisor(tmp_path, "cheap")
    runs = {"model": [], "cheap": []}  # type: dict[str, list[int]]
    with open_store(model.db) as store:
        for i in range(10):
            if i % 2:
                runs["model"].append(store.start_run("sleep", {"s": 1.0}, queue="model"))
            else:
                runs["cheap"].append(store.start_run("noop", queue="cheap"))
    try:
        model.start("--drain", "--queues", "model", n=2)
        cheap.start("--drain", "--queues", "cheap", n=1)
        assert cheap.wait_exit(60) == 0
        assert model.proc is not None and model.proc.poll() is None  # still on its calls
        assert model.wait_exit(60) == 0
        pids = {
            name: {e["worker"] for e in sv.events("worker_started")}
            for name, sv in (("model", model), ("cheap", cheap))
        }
        with open_store(model.db) as store:
            for queue, ids in runs.items():
                for run_id in ids:
                    run = store.get_run(run_id)
                    assert run is not None and run.status == "succeeded"
                    assert run.result["pid"] in pids[queue], (queue, run.result)
    finally:
        model.kill_all()
        cheap.kill_all()
