"""Webhooks under chaos, on both backends: two supervisors under faults (kills and pauses, a
short ttl) run a workload while a local receiver takes the deliveries; a third supervisor (no
chaos) delivers what is left.

- Delivery: a fault every second, a receiver that fails 30 % of the requests and is
  down for a while: every event is delivered at least once, in order per run, with a valid
  signature, and nothing is given up on.
- Re-sends: a fault every 2 s, 400 runs (1,200 when first measured), a
  webhook on every kind: a fault re-sends at most what the delivery's window held open
  (``WINDOW`` events: the position moves to the contiguous acknowledged event after each round
  of answers), so at most 5 % of the events are delivered twice (with the position moved once a
  second, 450 of 1,200 ``run.succeeded`` were). A webhook added with a window of 1
  (``in_flight=1``: one POST at a time) keeps the bounds from before the window: at most two
  repeats per struck delivery (the POST in flight and, for a pause, one begun just before it)
  and 2 % of the events.
"""

from __future__ import annotations

import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pg_session
import pytest
from helpers import wait_for
from sv_harness import Supervisor
from webhook_receiver import Delivery, Receiver

from workerproc.store import Event, open_store
from workerproc.store.webhooks import RetryNumbers, WebhookInfo
from workerproc.window import WINDOW

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # soaks: scripts/test-e2e runs them

APP = "apps.ledger_app:app"
SECRET = "chaos-secret"
CHAOS = ["--drain", "--lease-ttl", "1", "--poll-interval", "0.2", "--max-attempts", "20",
         "--chaos", "--chaos-faults", "kill,pause"]  # fmt: skip
RETRY = RetryNumbers(max_failures=1000, backoff=0.05, backoff_max=0.5, timeout=2.0)
ONE_AT_A_TIME = replace(RETRY, in_flight=1)  # the window at 1: one POST in flight at most


@dataclass
class Soak:
    """What a soak delivered: the events, every request the receiver saw, the delivery's
    record, and how often a fault took a delivery over."""

    events: list[Event]
    runs: list[int]
    tries: list[Delivery]
    info: WebhookInfo
    taken: int  # delivery attempts taken over by another worker
    struck: int  # delivery attempts cut short by a fault: taken over, or released as dead

    def repeated(self) -> int:
        """Deliveries its receiver accepted that it had accepted before (events sent twice)."""
        seen = Counter(d.event["id"] for d in self.tries if d.accepted)
        return sum(n - 1 for n in seen.values())


def run_soak(
    tmp_path: Path, db: str, runs_n: int, *, interval: float = 1.0, fail_share: float = 0.3,
    kinds: list[str] | None = None, payload: dict[str, Any] | None = None, outage: bool = True,
    n: int = 2, args: tuple[str, ...] = (), retry: RetryNumbers = RETRY,
) -> Soak:  # fmt: skip
    receiver = Receiver(SECRET, fail_share=fail_share, seed=11)
    ledger = tmp_path / "ledger.jsonl"
    step = {"n": 0, "steps": 2, "sleep": 0.1, "sleep_max": 0.3, **(payload or {}),
            "ledger": str(ledger)}  # fmt: skip
    with open_store(db) as store:
        hook = store.add_webhook("chaos", receiver.url, secret=SECRET, after=0, retry=retry,
                                 kinds=kinds)  # fmt: skip
        runs = store.start_runs([{"task": "step", "payload": step}] * runs_n)
    sups = [Supervisor(tmp_path, "sv1"), Supervisor(tmp_path, "sv2")]
    closer = Supervisor(tmp_path, "sv3")
    try:
        for i, sv in enumerate(sups):
            sv.db = db
            sv.start(*CHAOS, "--chaos-interval", str(interval), "--chaos-seed", str(3 + i),
                     *args, app=APP, n=n)  # fmt: skip
        wait_for(lambda: len(receiver.accepted()) >= 5, 60, what="the first deliveries")
        if outage:
            receiver.down()  # down for a while: connections are refused
            time.sleep(2.0)
            receiver.up()
        codes = [sv.wait_exit(120) for sv in sups]
        assert codes == [0, 0], "".join(sv.text()[-3000:] for sv in sups)
        with open_store(db) as store:
            events = [e for e in store.events(limit=10_000) if kinds is None or e.kind in kinds]
            last = events[-1].id

            def delivered() -> bool:  # and not failing: a try of a later event may be
                (now,) = store.webhooks()  # under way, and the receiver refuses some
                return now.cursor >= last and now.failures == 0

            closer.db = db
            closer.start("--poll-interval", "0.2", app=APP, n=1)
            closer.wait_event("worker_running")  # its signal handlers are in place
            wait_for(delivered, 60, what="the rest delivered")
            (info,) = store.webhooks()
            history = store.attempt_history(hook.run_id)
        closer.signal(signal.SIGTERM)
        assert closer.wait_exit(30) == 0
    finally:
        receiver.down()
        for sv in [*sups, closer]:
            sv.kill_all()
    taken = sum(h.outcome == "taken_over" for h in history)
    return Soak(events, runs, receiver.all(), info, taken, len(history))


def test_sqlite_webhooks_deliver_every_event_through_chaos_and_a_failing_receiver(
    tmp_path: Path,
) -> None:
    check_soak(run_soak(tmp_path, str(tmp_path / "lk.db"), 30))


def test_postgres_webhooks_deliver_every_event_through_chaos_and_a_failing_receiver(
    tmp_path: Path,
) -> None:
    check_soak(run_soak(tmp_path, pg_session.schema_url("webhooks"), 24))


def check_soak(soak: Soak) -> None:
    events, runs, tries, info, taken = soak.events, soak.runs, soak.tries, soak.info, soak.taken
    refused = sum(not d.accepted for d in tries)
    print({"events": len(events), "requests": len(tries), "refused": refused,
           "delivered": info.delivered, "deliveries_taken_over": taken,
           "repeated": soak.repeated()})  # fmt: skip
    assert taken >= 1, "chaos struck a delivery in flight (so fencing covered delivery)"
    assert all(d.signed for d in tries), "every delivery's signature verifies"
    assert refused > 0, "the receiver failed some on purpose"
    assert info.dead_total == 0 and info.failures == 0
    accepted = [d.event for d in tries if d.accepted]
    assert {e["id"] for e in accepted} >= {e.id for e in events}, "every event at least once"
    assert {e["run_id"] for e in accepted} == set(runs)
    first_seen: dict[int, list[int]] = defaultdict(list)
    for e in accepted:
        ids = first_seen[e["run_id"]]
        if e["id"] not in ids:
            ids.append(e["id"])
    for run_id, ids in first_seen.items():
        assert ids == sorted(ids), f"run {run_id}'s events out of order: {ids}"
    for e in accepted:  # what was delivered is what was written
        assert e["webhook"] == "chaos" and e["kind"] and e["at"] > 0


# -- a fault re-sends at most what was in flight ------------------------------------------------
QUICK = {"steps": 1, "sleep": 0.01, "sleep_max": 0.04}  # a run: one short step
# one worker of two slots per supervisor: a fault strikes the process delivering one time in two
POOL: dict[str, Any] = {"n": 1, "args": ("--concurrency", "2")}


def check_repeats(soak: Soak, per_strike: int = WINDOW, most: float = 5.0) -> None:
    """Each fault that struck a delivery re-sent at most what its window held open:
    ``per_strike`` events sent and not yet below the position (in flight, or answered behind one
    still in flight; for a pause, one begun just before it counts among them), so no repeat
    without a strike; and at most ``most`` % of the events in all (at the default window,
    ``WINDOW`` per strike and 5 %)."""
    repeated = soak.repeated()
    share = 100 * repeated / len(soak.events)
    print({"events": len(soak.events), "deliveries_struck": soak.struck,
           "repeated": repeated, "repeated_pct": round(share, 2)})  # fmt: skip
    accepted = {d.event["id"] for d in soak.tries if d.accepted}
    assert accepted >= {e.id for e in soak.events}, "every event at least once"
    assert repeated <= per_strike * soak.struck, f"{repeated} repeats from {soak.struck} struck"
    assert share <= most, f"{repeated} of {len(soak.events)} events delivered twice"


def check_one_at_a_time(soak: Soak) -> None:
    """A window of 1, the bounds from before the window: each strike re-sent at most the POST in
    flight and, for a pause, one begun just before it; at most 2 % of the events in all."""
    assert soak.info.retry.in_flight == 1
    check_repeats(soak, per_strike=2, most=2.0)


def test_sqlite_a_fault_re_sends_at_most_the_deliveries_in_flight(tmp_path: Path) -> None:
    check_repeats(run_soak(tmp_path, str(tmp_path / "lk.db"), 400, interval=2.0,
                           fail_share=0.0, payload=QUICK, outage=False, **POOL))  # fmt: skip


def test_postgres_a_fault_re_sends_at_most_the_deliveries_in_flight(tmp_path: Path) -> None:
    check_repeats(run_soak(tmp_path, pg_session.schema_url("repeats"), 400, interval=2.0,
                           fail_share=0.0, payload=QUICK, outage=False, **POOL))  # fmt: skip


def test_sqlite_one_post_at_a_time_a_fault_re_sends_at_most_the_one_in_flight(
    tmp_path: Path,
) -> None:
    check_one_at_a_time(run_soak(tmp_path, str(tmp_path / "lk.db"), 400, interval=2.0,
                                 fail_share=0.0, payload=QUICK, outage=False,
                                 retry=ONE_AT_A_TIME, **POOL))  # fmt: skip


def test_postgres_one_post_at_a_time_a_fault_re_sends_at_most_the_one_in_flight(
    tmp_path: Path,
) -> None:
    check_one_at_a_time(run_soak(tmp_path, pg_session.schema_url("one"), 400, interval=2.0,
                                 fail_share=0.0, payload=QUICK, outage=False,
                                 retry=ONE_AT_A_TIME, **POOL))  # fmt: skip
