"""Paid once's surfaces: ``show`` lists a run's paid calls (reused, paid twice),
``supervisor forget RUN NAME`` drops them (one clear line on error), metrics count them, and
``run_inline`` runs ``ctx.once`` as a worker does."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import invoke
from helpers import FakeClock
from notify_fakes import FlakyGate, fake_arbiter
from prometheus_client.parser import text_string_to_metric_families
from sv_harness import Supervisor
from web_helpers import client, text_of

from supervisor import exitcodes
from supervisor.chaos import report
from supervisor.integrations.metrics import Metrics
from supervisor.integrations.probe import StatsProbe
from workerproc import App, TaskContext
from workerproc.once import call_key
from workerproc.store import Store, open_store
from workerproc.store.calls import CallTotals
from workerproc.testing import run_inline

REQ = {"prompt": "hi"}


def paid_twice(store: Store) -> int:
    """A run whose call was kept, reused once, and paid again by a loser of a race."""
    run = store.start_run("call")
    lease = store.claim("w1", 30)
    assert lease is not None
    key = call_key(lease, "llm", REQ)
    start = store.begin_call(lease, key)
    assert start.outcome == "call" and start.intent is not None
    store.keep_call(lease, key, {"text": "a"}, 120, intent=start.intent)
    store.keep_call(lease, key, {"text": "b"}, 80)  # lost the race: paid, unused
    assert store.begin_call(lease, key).outcome == "reused"
    return run


def test_show_lists_the_calls_and_forget_drops_them(db: str) -> None:
    with open_store(db) as store:
        run = paid_twice(store)
    shown = invoke("show", str(run), "--db", db)
    assert shown.exit_code == 0, shown.output
    assert "paid calls:" in shown.stdout
    (line,) = [x for x in shown.stdout.splitlines() if x.split()[1:2] == ["llm"]]
    assert "paid 2x, reused 1x" in line and "120" in line
    gone = invoke("forget", str(run), "llm", "--db", db)
    assert gone.exit_code == 0 and "forgot 1 paid call" in gone.stdout
    # the answer is gone, the call it paid for is not: still made once, no answer kept now
    (line,) = [
        x
        for x in invoke("show", str(run), "--db", db).stdout.splitlines()
        if x.split()[1:2] == ["llm"]
    ]
    assert "paid once, no answer kept" in line and "120" not in line and "reused" not in line
    for args, words in [((str(run), "llm"), "has no paid call named 'llm'"),
                        (("999999", "llm"), "no run with id 999999")]:  # fmt: skip
        again = invoke("forget", *args, "--db", db)
        assert again.exit_code == exitcodes.ERROR, again.output
        lines = again.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in again.output


def test_metrics_count_reused_and_paid_unused_calls(clock: FakeClock) -> None:
    gate = FlakyGate()
    gate.calls = CallTotals(calls=3, reused=2, unused=1, tokens=300, saved_tokens=200,
                            unused_tokens=90, started=5, paid_again=2, unknown=1)  # fmt: skip
    arb = fake_arbiter(clock, gate)
    metrics = Metrics(StatsProbe())
    metrics.install(arb)
    families = {f.name: f for f in text_string_to_metric_families(metrics.render(arb))}
    calls = {s.labels["outcome"]: s.value for s in families["leasekeeper_paid_calls"].samples}
    tokens = {s.labels["outcome"]: s.value
              for s in families["leasekeeper_paid_call_tokens"].samples}  # fmt: skip
    assert calls == {"paid": 3, "reused": 2, "paid_unused": 1}
    assert tokens == {"paid": 300, "saved": 200, "paid_unused": 90}
    every = {s.labels["outcome"]: s.value for s in families["leasekeeper_calls"].samples}
    assert every == {"started": 5, "kept": 3, "reused": 2, "paid_again": 2, "unknown": 1}


def test_the_chaos_report_counts_every_paid_call(capsys: pytest.CaptureFixture[str]) -> None:
    totals = CallTotals(calls=3, reused=2, unused=1, tokens=300, saved_tokens=200,
                        unused_tokens=90, started=6, paid_again=3, unknown=2)  # fmt: skip
    counted = report.paid_calls(totals)
    assert {k: counted[k] for k in ("started", "kept", "reused", "paid_again", "unknown")} == {
        "started": 6, "kept": 3, "reused": 2, "paid_again": 3, "unknown": 2}  # fmt: skip
    assert counted["tokens_saved"] == 200 and counted["paid_unused"] == 1  # as before
    doc = {
        "faults": {"kill": 1, "pause": 0},
        "leases_hit": 1,
        "spared": 0,
        "taken_over": 1,
        "orphaned_leases": 1,
        "takeover_ms": {"p50": 1, "p99": 1},
        "zombie_writes_rejected": 0,
        "warnings": [],
        "violations": [],
        "ok": True,
        "paid_calls": report.paid_calls(CallTotals(started=2, paid_again=1, unknown=1)),
    }
    report.print_text(doc, [1.0], None)
    line = next(x for x in capsys.readouterr().err.splitlines() if "paid calls" in x)
    assert "2 started, 0 kept, 0 reused, 1 paid again, 1 unknown" in line  # none kept: shown


def test_run_inline_runs_once_as_a_worker_does(tmp_path: Path) -> None:
    app = App()
    paid = []

    @app.task
    def call(ctx: TaskContext) -> str:
        answer = ctx.once("llm", REQ, lambda: paid.append(1) or "paid", tokens=5)
        assert ctx.last_once is not None and not ctx.last_once.reused
        return str(answer)

    with open_store(str(tmp_path / "lk.db")) as store:
        run = run_inline(app, "call", store=store)
        assert run.result == "paid" and paid == [1]
        (kept,) = store.paid_calls(run.id)
        assert kept.tokens == 5


def test_the_dashboards_run_page_shows_reused_and_twice_paid_calls(tmp_path: Path) -> None:
    with open_store(str(tmp_path / "lk.db")) as store:
        run = paid_twice(store)
        page = client(store).get(f"/runs/{run}")
    assert page.status_code == 200
    text = text_of(page.text)
    assert "Paid calls (ctx.once)" in text and 'class="paid-twice"' in page.text
    assert "paid 2x, reused 1x" in text and "(+80 unused)" in text


@pytest.mark.slow
def test_a_real_worker_reuses_the_answer_on_its_retry_plain_and_async(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    db = str(tmp_path / "lk.db")
    with open_store(db) as store:
        runs = store.start_runs([{"task": task, "payload": {"ledger": str(ledger)}}
                                 for task in ("once_then_fail", "async_once_then_fail")
                                 for _ in range(3)])  # fmt: skip
    sv = Supervisor(tmp_path)
    sv.db = db
    try:
        sv.start("--drain", "--retry-backoff", "0.05", app="apps.once_app:app", n=1)
        assert sv.wait_exit(60) == 0, sv.text()[-3000:]
    finally:
        sv.kill_all()
    bills = [line for line in ledger.read_text().splitlines() if '"bill"' in line]
    assert len(bills) == len(runs)  # each run paid once, though each ran twice
    with open_store(db) as store:
        for run_id in runs:
            run = store.get_run(run_id)
            assert run is not None and run.status == "succeeded" and run.state == {"reused": 1}
            (call,) = store.paid_calls(run_id)
            assert (call.attempt, call.reused) == (1, 1)
