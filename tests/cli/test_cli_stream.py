"""``supervisor stream RUN`` against a real database on both backends: the text as it stands
(a reset said on its own line), ``--after``, ``--json`` (one object per line), ``--follow`` in
a process of its own that prints each chunk as it is written and ends with its run; a missing
run, a bad offset, in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cli_runner import invoke
from helpers import wait_for
from sv_harness import env_with_tests

from workerproc.store import CasResult, ClaimRequest, Commit, Lease, Store, open_store


def leased(store: Store) -> Lease:
    store.start_run("answer")
    return store.commit_many([], claim=ClaimRequest("w1", 60.0)).leases[0]


def test_stream_prints_text_json_and_after(db: str) -> None:
    with open_store(db) as store:
        lease = leased(store)
        store.append_stream(lease, ['"hello "', '"world"', '{"n": 1}'])
    result = invoke("stream", str(lease.run_id), "--db", db)
    assert result.exit_code == 0, result.output
    assert result.stdout == 'hello world{"n": 1}\n\n'
    docs = [json.loads(x) for x in invoke("stream", str(lease.run_id), "--db", db, "--json",
                                          "--after", "1").stdout.splitlines()]  # fmt: skip
    assert [(d["offset"], d["kind"], d["data"]) for d in docs] == [
        (2, "data", "world"),
        (3, "data", {"n": 1}),
    ]
    assert set(docs[0]) == {"offset", "attempt", "step", "kind", "data", "at"}


def test_stream_of_a_missing_run_or_a_bad_offset_is_one_line(db: str) -> None:
    with open_store(db):
        pass
    missing = invoke("stream", "42", "--db", db)
    assert missing.exit_code == 1
    assert missing.stderr.strip() == "supervisor: error: run 42 not found"
    bad = invoke("stream", "1", "--db", db, "--after", "-1")
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "Traceback" not in bad.output


def test_stream_follow_prints_each_chunk_as_written_and_ends_with_its_run(
    db: str, tmp_path: Path
) -> None:
    with open_store(db) as store:
        lease = leased(store)
        last = store.append_stream(lease, ['"first"']).last
        out = tmp_path / "follow.out"
        with open(out, "wb") as sink:
            proc = subprocess.Popen([sys.executable, "-m", "supervisor", "stream",
                                     str(lease.run_id), "--db", db, "--follow", "--json"],
                                    stdout=sink, stderr=subprocess.STDOUT, env=env_with_tests(),
                                    start_new_session=True)  # fmt: skip
        try:

            def seen() -> list[object]:
                return [json.loads(x)["data"] for x in out.read_text().splitlines()
                        if x.startswith("{")]  # fmt: skip

            wait_for(lambda: seen() == ["first"], 30, what="the first chunk")
            store.append_stream(lease, ['"second"'], after=last)
            wait_for(lambda: seen() == ["first", "second"], 30, what="the new chunk")
            done = store.commit_many([Commit(lease, "finish")]).results
            assert done == (CasResult.OK,)
            assert proc.wait(30) == 0, out.read_text()  # the run is over: it ends
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_stream_follow_stops_when_its_database_file_goes(tmp_path: Path) -> None:
    """A follower of a deleted SQLite file says so in one line and exits 1 (its run would
    never end in the old inode it goes on reading), as ``events --follow`` does."""
    db = str(tmp_path / "lk.db")
    with open_store(db) as store:
        lease = leased(store)
        store.append_stream(lease, ['"first"'])
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "stream", str(lease.run_id),
                             "--db", db, "--follow", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env_with_tests(),
                            start_new_session=True, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("{")  # following
        for suffix in ("", "-wal", "-shm"):
            Path(db + suffix).unlink(missing_ok=True)
        _, err = proc.communicate(timeout=30)  # it looks once a second
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 1, err
    assert len(err.strip().splitlines()) == 1 and "stopping" in err and "Traceback" not in err
