"""Limits, paid calls, waits and webhooks together under chaos, on both
backends with two supervisors sharing the database (tests/apps/features_app.py). Every step
waits behind a shared cap and a cap per tenant and makes its paid call inside ``ctx.once``; a
webhook takes every run's success; kills and pauses strike handlers; ``--max-attempts 3`` (what
chaos promises to survive).

- Both pools drain and exit 0: no violation in either chaos verdict, and the drain waited for
  the webhook to deliver what it could.
- Every run succeeded; no lease invariant is broken; the caps held at every moment (judged from
  the handlers' ledger and the attempt history, as tests/chaos/test_limits_chaos.py does).
- No step was paid after its answer was kept; the receiver had every run's ``run.succeeded``
  by the time the pools exited.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pg_session
import pytest
from apps.features_app import API_CAP, TENANT_CAP
from limit_spans import entries, live_spans, most_at_once
from sv_harness import Supervisor
from webhook_receiver import Receiver

from workerproc.store import open_store
from workerproc.store.webhooks import RetryNumbers

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # soaks: scripts/test-e2e runs them

APP = "apps.features_app:app"
SECRET = "features-secret"
CHAOS = ["--drain", "--lease-ttl", "1", "--poll-interval", "0.2", "--max-attempts", "3",
         "--chaos", "--chaos-faults", "kill,pause", "--chaos-interval", "0.8"]  # fmt: skip
RETRY = RetryNumbers(max_failures=1000, backoff=0.05, backoff_max=0.5, timeout=2.0)
TENANTS = 4


def run_soak(tmp_path: Path, db: str, runs_n: int) -> None:
    path = tmp_path / "ledger.jsonl"
    receiver = Receiver(SECRET, fail_share=0.1, seed=5)
    items = [{"task": "call", "payload": {"n": 0, "steps": 2, "tenant": f"t{i % TENANTS}",
                                          "ledger": str(path)}}
             for i in range(runs_n)]  # fmt: skip
    with open_store(db) as store:
        store.add_webhook("done", receiver.url, secret=SECRET, kinds=["run.succeeded"],
                          after=0, retry=RETRY)  # fmt: skip
        runs = store.start_runs(items)
    sups = [Supervisor(tmp_path, "sv1"), Supervisor(tmp_path, "sv2")]
    try:
        for i, sv in enumerate(sups):
            sv.db = db
            sv.start(*CHAOS, "--chaos-seed", str(11 + i), "--concurrency", "3", app=APP, n=2)
        codes = [sv.wait_exit(240) for sv in sups]
        assert codes == [0, 0], "".join(sv.text()[-4000:] for sv in sups)
        delivered = {d.event["run_id"] for d in receiver.all() if d.accepted}
    finally:
        receiver.down()
        for sv in sups:
            sv.kill_all()
    log = entries(path)
    with open_store(db) as store:
        statuses = [store.get_run(r).status for r in runs]  # type: ignore[union-attr]
        assert statuses == ["succeeded"] * len(runs), statuses
        assert store.integrity_violations() == []
    assert delivered >= set(runs), f"not delivered by the drain's end: {set(runs) - delivered}"
    spans = live_spans(db, log)
    assert most_at_once(spans) <= API_CAP, "the shared cap was exceeded"
    by_tenant: dict[str, list[Any]] = defaultdict(list)
    for span in spans:
        by_tenant[span[2]["tenant"]].append(span)
    assert all(most_at_once(s) <= TENANT_CAP for s in by_tenant.values()), "a tenant's cap"
    kept: dict[int, float] = {}
    for e in log:
        if e["ev"] == "kept":
            kept[e["task"]] = min(kept.get(e["task"], e["t"]), e["t"])
    again = [e for e in log if e["ev"] == "bill" and e["t"] > kept.get(e["task"], float("inf"))]
    assert again == [], "a step was paid again after its answer was kept"
    faults = sum(len(sv.events("chaos_fault")) for sv in sups)
    print({"runs": len(runs), "faults": faults, "bills": sum(e["ev"] == "bill" for e in log),
           "deliveries": len(receiver.all())})  # fmt: skip


def test_sqlite_limits_webhooks_and_once_under_chaos(tmp_path: Path) -> None:
    run_soak(tmp_path, str(tmp_path / "lk.db"), 24)


def test_postgres_limits_webhooks_and_once_under_chaos(tmp_path: Path) -> None:
    run_soak(tmp_path, pg_session.schema_url("features"), 24)
