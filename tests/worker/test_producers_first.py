"""A worker's exchange while a producer waits (SQLite, ``protocol.leases.CROWDED_CLAIM``):
with a producer announced on ``DB-producers`` the exchange claims at most ``CROWDED_CLAIM`` (its
write transaction stays short, and the producer's wait for the write lock with it); with none,
the full window the policy asked for. A claim cut short is not read as a queue run dry."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import cast

from workerproc.completer import Completer
from workerproc.config import WorkerConfig
from workerproc.exchange import Exchange, Publisher
from workerproc.heartbeat import Heartbeat
from workerproc.holdings import Holdings
from workerproc.policy import ADAPTIVE_PREFETCH, Policy, View
from workerproc.signals import Signals
from workerproc.status import Counters
from workerproc.store import Lease, open_store
from workerproc.store.protocol.leases import CROWDED_CLAIM
from workerproc.store.sqlite.intent import Intent


class Held:
    """The heartbeat's part: nothing to renew here."""

    def track(self, lease: Lease, lease_start: float) -> None:
        pass

    def untrack(self, leases: Iterable[Lease]) -> None:
        pass


def test_an_exchange_claims_the_smaller_limit_while_a_producer_is_announced(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "jobs.db")
    store = open_store(db)
    try:
        store.start_runs([{"task": "t"} for _ in range(200)])
        config = WorkerConfig(db=db, app="tests:app", prefetch=ADAPTIVE_PREFETCH)
        policy = Policy(config, Signals())
        holdings = Holdings()
        completer = Completer(store, 60.0, Held())
        publisher = Publisher(None, holdings, Counters())
        heartbeat = cast(Heartbeat, Held())  # (only ``abandon`` uses it)
        exchange = Exchange("w", config, completer, holdings, policy, heartbeat, publisher)
        want = config.concurrency + ADAPTIVE_PREFETCH
        assert want > CROWDED_CLAIM

        def claimed() -> int:
            exchange.commit_and_claim(False, want, start=0)
            return len(holdings.take_waiting())  # (each round starts with nothing held)

        # a producer in another process waits for the write lock (announced on DB-producers)
        with Intent(db + "-producers").announce():
            assert claimed() == CROWDED_CLAIM
            assert completer.narrowed == CROWDED_CLAIM
        assert policy.turn(View()).claim  # cut short, not run dry: a claim alone may follow
        assert claimed() == want  # nobody announced: the full window, nothing changes
        assert completer.narrowed is None
    finally:
        store.close()
