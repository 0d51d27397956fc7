"""Runs' streams (B21) under chaos, on both backends: two supervisors share the database (kills
and pauses), 100 runs each emit 500 chunks, and a follower process reads every stream live
while they run. Judged from the follower's record, the store and the handlers' own ledger
(tests/apps/stream_app.py):

- the follower saw each run's offsets strictly increase from 1, no gap, no duplicate, and
  exactly the chunks the store holds;
- no zombie chunk after a reset: once a step's reset (or its first chunk) names an attempt,
  every chunk of that step up to its next reset is that attempt's;
- each succeeded run's final stream (its chunks after the last reset) is exactly the
  committing attempt's chunks, as its handler recorded them in the ledger.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pg_session
import pytest
from sv_harness import Supervisor, env_with_tests

from workerproc.store import open_store
from workerproc.store.streams import Chunk

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(900)]

APP = "apps.stream_app:app"
CHAOS = ["--drain", "--lease-ttl", "1", "--poll-interval", "0.2", "--prefetch", "0",
         "--max-attempts", "30", "--chaos", "--chaos-faults", "kill,pause",
         "--chaos-interval", "1.0"]  # fmt: skip
RUNS, CHUNKS = 100, 500
FOLLOWER = Path(__file__).with_name("stream_follower.py")


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def spliced(chunks: list[Chunk]) -> list[str]:
    """A chunk of a step whose attempt is not the one its step's last reset (or first chunk)
    named: a zombie's chunk after a reset, or a takeover without one."""
    current: dict[int, int] = {}
    wrong = []
    for c in chunks:
        if c.kind == "reset":
            current[c.step] = c.attempt
        elif current.setdefault(c.step, c.attempt) != c.attempt:
            wrong.append(f"offset {c.offset}: attempt {c.attempt} of step {c.step}")
    return wrong


def final(chunks: list[Chunk]) -> list[Any]:
    """The step's final stream: its chunks after its last reset."""
    resets = [i for i, c in enumerate(chunks) if c.kind == "reset"]
    return [c.data for c in chunks[(resets[-1] + 1 if resets else 0) :]]


def run_soak(tmp_path: Path, db: str, name: str) -> None:
    ledger, seen = tmp_path / "ledger.jsonl", tmp_path / "follower.jsonl"
    items = [{"task": "answer", "payload": {"chunks": CHUNKS, "ledger": str(ledger)}}
             for _ in range(RUNS)]  # fmt: skip
    with open_store(db) as store:
        runs = store.start_runs(items)
    follower = subprocess.Popen(
        [sys.executable, str(FOLLOWER), db, str(seen), *map(str, runs)], env=env_with_tests(),
        stderr=subprocess.PIPE,
    )  # fmt: skip
    sups = [Supervisor(tmp_path, "sv1"), Supervisor(tmp_path, "sv2")]
    try:
        for i, sv in enumerate(sups):
            sv.db = db
            sv.start(*CHAOS, "--chaos-seed", str(21 + i), "--concurrency", "2", app=APP, n=2)
        codes = [sv.wait_exit(400) for sv in sups]
        assert codes == [0, 0], "".join(sv.text()[-3000:] for sv in sups)
        _, err = follower.communicate(timeout=120)
        assert follower.returncode == 0, err.decode()[-3000:]
    finally:
        for sv in sups:
            sv.kill_all()
        if follower.poll() is None:
            follower.kill()
            follower.wait(10)
    got = lines(seen)
    assert got[-1] == {"done": True}
    live: dict[int, list[dict[str, Any]]] = {r: [] for r in runs}
    for doc in got[:-1]:
        live[doc.pop("run")].append(doc)
    emitted = {(e["task"], e["attempt"]): e["chunks"] for e in lines(ledger)
               if e["ev"] == "emitted"}  # fmt: skip
    takeovers = resets = 0
    with open_store(db) as store:
        assert store.integrity_violations() == []
        for run_id in runs:
            run = store.get_run(run_id)
            assert run is not None and run.status == "succeeded", run
            chunks = store.stream(run_id, 0, 10_000)
            offsets = [d["offset"] for d in live[run_id]]
            assert offsets == list(range(1, len(offsets) + 1)), f"run {run_id}: {offsets[:20]}"
            assert [Chunk(**d) for d in live[run_id]] == chunks  # what the follower saw, live
            assert spliced(chunks) == [], f"run {run_id}"
            (task,) = store.get_tasks(run_id)
            assert task.done_attempt is not None
            assert final(chunks) == emitted[(task.id, task.done_attempt)], f"run {run_id}"
            resets += sum(c.kind == "reset" for c in chunks)
            takeovers += task.done_attempt > 1
        refused = [r for r in store.fence_rejections() if r.op == "emit"]
    print(f"\n[{name}] {RUNS} runs x {CHUNKS} chunks: {takeovers} committed after a takeover, "
          f"{resets} resets, {len(refused)} zombie batches refused")  # fmt: skip
    assert resets > 0 and refused  # the chaos did take streams over


def test_sqlite_streams_stay_whole_under_kills_and_pauses(tmp_path: Path) -> None:
    run_soak(tmp_path, str(tmp_path / "lk.db"), "sqlite")


def test_postgres_streams_stay_whole_under_kills_and_pauses(tmp_path: Path) -> None:
    run_soak(tmp_path, pg_session.schema_url("streams"), "postgres")
