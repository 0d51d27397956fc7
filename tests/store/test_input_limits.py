"""Input the pool must refuse: poison payloads, out-of-range numbers.

A value that passes at enqueue must be one every worker can decode; a number that passes must
be finite and sane. Everything a user gets wrong is one line and exit 2, never a traceback, and a
poison value already in the database fails its own run instead of killing its claimer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cli_runner import invoke
from click.testing import Result
from store_backends import Backend
from sv_harness import env_with_tests

from supervisor import exitcodes
from workerproc import TaskContext, options
from workerproc.config import WorkerConfig
from workerproc.store import Commit, InvalidPayload, Store, open_store
from workerproc.store.codec import MAX_DEPTH, MAX_PAYLOAD


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def usage_line(result: Result) -> str:
    assert result.exit_code == exitcodes.USAGE, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


# -- the store refuses values a worker could not decode -------------------------------------------
def test_start_run_refuses_deep_and_oversized_values(s: Store) -> None:
    store = s
    deep: list[object] = []
    for _ in range(MAX_DEPTH):
        deep = [deep]
    with pytest.raises(InvalidPayload, match=f"nested deeper than {MAX_DEPTH}"):
        store.start_run("t", deep)
    with pytest.raises(InvalidPayload, match="over the limit"):
        store.start_run("t", "x" * MAX_PAYLOAD)
    with pytest.raises(InvalidPayload, match="state is nested deeper"):
        store.start_run("t", None, state={"a": deep})
    assert store.list_runs() == []  # nothing was written
    store.start_run("t", [[[1]]])  # within the limits: fine


def test_a_run_starts_with_an_empty_state(s: Store) -> None:
    store = s
    run = store.get_run(store.start_run("t"))
    assert run is not None and run.state == {}


def test_advance_refuses_a_deep_payload_at_the_call(s: Store) -> None:
    store = s
    store.start_run("t")
    lease = store.claim("w", 60)
    assert lease is not None
    ctx = TaskContext(lease, threading.Event())
    deep: list[object] = []
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(InvalidPayload):
        ctx.advance({}, next="u", payload=deep)
    with pytest.raises(InvalidPayload):
        ctx.finish({"x": deep})
    assert ctx.commit is None  # nothing recorded: the handler can still say its last word
    ctx.finish({"ok": True})


def test_an_undecodable_stored_payload_fails_its_run_and_the_claim_goes_on(
    s: Store, backend: Backend
) -> None:
    store = s
    poison = store.start_run("t", {"ok": True})
    good = store.start_run("t", {"ok": True})
    backend.write_json("tasks", "payload", poison, nested(1999))  # an old version wrote it
    lease = store.claim("w", 60)
    assert lease is not None and lease.run_id == good
    run = store.get_run(poison)
    assert run is not None and run.status == "failed"
    assert run.failure_reason == "undecodable_payload"
    assert "cannot be decoded" in (run.last_error or "")


# -- the command line ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--payload", "NaN"], "NaN is not JSON"),
        (["--payload", '{"x": Infinity}'], "Infinity is not JSON"),
        (["--payload", nested(980)], f"nested deeper than {MAX_DEPTH} levels"),
        (["--payload", nested(20_000)], f"nested deeper than {MAX_DEPTH} levels"),
        (["--payload", "{"], "not valid JSON"),
        (["--state", nested(500)], "nested deeper"),
        (["--delay", "inf"], "--delay must be a number from 0 to 31,536,000 (got inf)"),
        (["--delay", "nan"], "--delay must be a number"),
        (["--delay", "-1"], "--delay must be a number from 0"),
    ],
)
def test_enqueue_refuses_bad_input_with_one_line(tmp_path: Path, args: list[str], words: str):
    db = str(tmp_path / "lk.db")
    line = usage_line(invoke("enqueue", "t", "--db", db, *args))
    assert words in line
    assert not os.path.exists(db) or open_store(db).list_runs() == []


@pytest.mark.parametrize(
    "args",
    [["runs", "--limit", "0"], ["runs", "--limit", "1e9"], ["show", "99999999999999999999"]],
)
def test_operator_numbers_have_ranges(tmp_path: Path, args: list[str]) -> None:
    db = str(tmp_path / "lk.db")
    open_store(db).close()
    usage_line(invoke(*args, "--db", db))


def test_show_of_an_undecodable_run_is_one_line(s: Store, backend: Backend) -> None:
    run_id = s.start_run("t")
    backend.write_json("runs", "state", run_id, nested(1999))
    result = invoke("show", str(run_id), "--db", backend.url)
    assert result.exit_code == exitcodes.ERROR
    assert "Traceback" not in result.output
    assert "cannot be decoded" in result.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--lease-ttl", "inf"], "--lease-ttl must be a finite number"),
        (["--lease-ttl", "1e-9"], "--lease-ttl must be >= 0.5"),
        (["--max-attempts", "0"], "--max-attempts must be >= 1"),
        (["--poll-interval", "x"], "'x' is not a number"),
    ],
)
def test_standalone_worker_refuses_bad_numbers(tmp_path: Path, args: list[str], words: str):
    cmd = [sys.executable, "-m", "workerproc", "--db", str(tmp_path / "x.db"), "--app", "m:a"]
    done = subprocess.run(
        [*cmd, *args], capture_output=True, text=True, timeout=60, env=env_with_tests()
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], done.stderr
    assert not (tmp_path / "x.db").exists()


def test_standalone_worker_help_lists_every_declared_option() -> None:
    """``--help`` renders (a ``%`` in a help text once crashed argparse's formatting)."""
    done = subprocess.run(
        [sys.executable, "-m", "workerproc", "--help"],
        capture_output=True, text=True, timeout=60, env=env_with_tests(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for d in options.declared(WorkerConfig):
        if d.opt.on_worker:
            assert d.opt.long in done.stdout
    assert "%" in done.stdout  # the jitter's "±25 %" is shown, not swallowed


# -- names: the same limits on every backend ------------------------------------------------------
BAD_NAMES = {
    "NUL": "a\x00b",
    "a lone surrogate": "a\udcffb",
    "one character too many": "x" * 201,
    "100,000 characters": "x" * 100_000,
}


@pytest.mark.parametrize("bad", sorted(BAD_NAMES))
@pytest.mark.parametrize("field", ["task", "key", "queue"])
def test_every_backend_refuses_the_same_names_on_every_path(
    s: Store, backend: Backend, field: str, bad: str
) -> None:
    """A key, task name or queue name one backend could store and another could not is
    refused on both alike (InvalidPayload, never UnicodeEncodeError), whether it comes through
    start_run, start_runs, the caller's transaction or an advance; nothing is written."""
    value = BAD_NAMES[bad] if field != "key" or bad != "one character too many" else "k" * 256
    item = {"task": "t", field: value}
    with pytest.raises(InvalidPayload):
        s.start_run(**item)  # type: ignore[arg-type]
    with pytest.raises(InvalidPayload):
        s.start_runs([{"task": "t"}, item])
    conn = backend.app_connection()
    try:
        with pytest.raises(InvalidPayload):
            s.start_runs([item], tx=conn)
    finally:
        conn.rollback()
        conn.close()
    assert s.list_runs() == []
    if field != "key":  # an advance names its next task and, maybe, another queue
        s.start_run("t")
        lease = s.claim("w", 60)
        assert lease is not None
        step = {"next_task": value} if field == "task" else {"next_task": "n", "next_queue": value}
        with pytest.raises(InvalidPayload):
            s.commit_many([Commit(lease, "advance", expected_revision=0, new_state={}, **step)])
        assert [t.name for t in s.get_tasks(lease.run_id)] == ["t"]


@pytest.mark.parametrize("bad", sorted(BAD_NAMES))
def test_a_name_no_store_could_hold_is_refused_when_looked_up_too(s: Store, bad: str) -> None:
    """A lookup by such a name (the CLI's --queue, the dashboard's task filter, a claim's
    queues and owner) is InvalidPayload on every backend, not an empty answer on one and an
    encoding error on another."""
    value = BAD_NAMES[bad]
    s.start_run("t")
    lookups = {
        "list_runs": lambda: s.list_runs(queue=value),
        "runs_page": lambda: s.runs_page(task=value),
        "next_ready_at": lambda: s.next_ready_at([value]),
        "claim's queues": lambda: s.claim("w", 60, queues=[value]),
        "claim's owner": lambda: s.claim(value if len(value) < 200 else "w" * 256, 60),
    }
    for what, lookup in lookups.items():
        with pytest.raises(InvalidPayload):
            lookup()
            pytest.fail(f"{what} took {bad}")
    assert s.stats().leased == 0
