"""PostgreSQL's stream batch (``protocol/streams.py``: ``append_in``) sends the head's lock and
the fence in one round trip (``Tx.rows_each``: one query of two statements). The fence must
still read after the lock: in READ COMMITTED each statement of the query takes its snapshot
when it begins, so a takeover (or a run's end) committed while the head's statement waited for
the lock is seen by the fence, and the batch refused."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from store_backends import PostgresBackend

from workerproc.store import ClaimRequest, Store
from workerproc.store.streams import Appended
from workerproc.store.types import Lease

pytestmark = pytest.mark.timeout(60)


def _leased(store: Store) -> Lease:
    store.start_run("t", None)
    (lease,) = store.commit_many([], claim=ClaimRequest("w1", 30.0)).leases
    assert store.append_stream(lease, ['"a"']).outcome == "written"
    return lease


def _while_the_head_is_held(
    pg: PostgresBackend, lease: Lease, change: str, write: Callable[[], Appended]
) -> Appended:
    """``write`` (a batch of ``lease``'s) started while another transaction holds the run's
    stream head; that transaction runs ``change`` once the batch waits for the lock, then
    commits. What the batch was answered."""
    got: list[Any] = []
    with pg.connect() as holder, pg.connect() as watcher:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM stream_heads WHERE run_id = %s FOR UPDATE", (lease.run_id,))
        pid = holder.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        thread = threading.Thread(target=lambda: got.append(write()))
        thread.start()
        deadline = time.monotonic() + 10
        while True:  # the batch's head statement waits for the holder's lock
            row = watcher.execute(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND %s = ANY("
                "SELECT unnest(pg_blocking_pids(pid)))",
                (pid,),
            ).fetchone()
            if row is not None and row[0] > 0:
                break
            assert time.monotonic() < deadline, "the batch never waited for the head's lock"
            time.sleep(0.01)
        holder.execute(change, {"run_id": lease.run_id})
        holder.execute("COMMIT")
        thread.join(10)
    assert len(got) == 1
    return got[0]  # type: ignore[no-any-return]


TAKEOVER = "UPDATE leases SET owner = 'thief' WHERE run_id = %(run_id)s"
ENDED = "UPDATE runs SET status = 'cancelled', finished_at = 1 WHERE id = %(run_id)s"


@pytest.mark.parametrize(("change", "outcome"), [(TAKEOVER, "lost"), (ENDED, "over")])
def test_a_batch_in_its_own_transaction_sees_what_committed_while_it_waited_for_the_head(
    pg_migrated: PostgresBackend, change: str, outcome: str
) -> None:
    with pg_migrated.open() as store:
        lease = _leased(store)
        got = _while_the_head_is_held(
            pg_migrated, lease, change, lambda: store.append_stream(lease, ['"b"'], after=1)
        )
        assert got.outcome == outcome
        assert [c.data for c in store.stream(lease.run_id)] == ["a"]


@pytest.mark.parametrize(("change", "outcome"), [(TAKEOVER, "lost"), (ENDED, "over")])
def test_a_batch_in_an_exchange_sees_what_committed_while_it_waited_for_the_head(
    pg_migrated: PostgresBackend, change: str, outcome: str
) -> None:
    with pg_migrated.open() as store:
        lease = _leased(store)

        def exchange() -> Appended:
            return store.commit_many([], streams=[(lease, ['"b"'], 1)]).appended[0]

        assert _while_the_head_is_held(pg_migrated, lease, change, exchange).outcome == outcome
        assert [c.data for c in store.stream(lease.run_id)] == ["a"]
