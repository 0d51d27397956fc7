"""Stream batches ride the worker's exchanges (B21, ``streaming.py``): while the conductor
exchanges, a due batch waits for its next exchange and is written in that transaction, on the
conductor's connection, fenced the same (a zombie's batch refused: ``LeaseLost`` at its next
emit); a flush never waits for an exchange; a batch an exchange could not write goes back to
the stream writer's thread, written as it was."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pytest
from helpers import FakeClock, wait_for
from store_backends import Backend

from workerproc import LeaseLost, TaskContext, streaming
from workerproc.completer import Completer
from workerproc.store import (
    BatchOutcome,
    ClaimRequest,
    Commit,
    Lease,
    Store,
    StoreUnavailable,
)
from workerproc.store.streams import Appended, StreamBatch
from workerproc.streaming import BATCH, Streamer

TTL = 60.0


class Held:
    """The heartbeat's part of completion: nothing to renew here."""

    def track(self, lease: Lease, lease_start: float) -> None:
        pass

    def untrack(self, leases: Iterable[Lease]) -> None:
        pass


class Counted(Store):
    """The real store, counting the batches written in transactions of their own, and
    failing its next ``failures`` exchanges (a busy database)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner.dialect)
        self.appends = 0
        self.failures = 0

    def append_stream(
        self, lease: Lease, texts: Sequence[str], *, after: int | None = None
    ) -> Appended:
        self.appends += 1
        return super().append_stream(lease, texts, after=after)

    def commit_many(
        self,
        commits: Sequence[Commit],
        *,
        claim: ClaimRequest | None = None,
        streams: Sequence[StreamBatch] = (),
    ) -> BatchOutcome:
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("database is locked")
        return super().commit_many(commits, claim=claim, streams=streams)


class Pool:
    """A worker's conductor and stream writer, on the current backend."""

    def __init__(self, backend: Backend, clock: FakeClock) -> None:
        self.thread_store = Counted(backend.open(clock))
        self.store = Counted(backend.open(clock))
        self.streams = Streamer(lambda: self.thread_store)
        self.completer = Completer(self.store, TTL, Held())
        self.completer.riders = self.streams

    def exchange(self, owner: str = "w1") -> tuple[Lease, ...]:
        return self.completer.commit_and_claim((), ClaimRequest(owner, TTL))

    def context(self, lease: Lease) -> TaskContext:
        return TaskContext(lease, threading.Event(), streams=self.streams)

    def close(self) -> None:
        self.streams.close()
        self.store.close()


@pytest.fixture
def pool(backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pool]:
    monkeypatch.setattr(streaming, "RIDE_WAIT", 30.0)  # the thread leaves due batches alone
    p = Pool(backend, clock)
    yield p
    p.close()


def offsets(store: Store, run_id: int) -> list[Any]:
    return [c.offset for c in store.stream(run_id, 0, 10_000)]


def test_a_due_batch_rides_the_next_exchange_and_a_flush_does_not_wait(pool: Pool) -> None:
    pool.store.start_runs([{"task": "answer"}, {"task": "other"}])
    (lease,) = pool.exchange()  # an exchange: the pool is busy, batches wait for the next
    ctx = pool.context(lease)
    for i in range(BATCH):  # due by count
        ctx.emit(f"{i} ")
    assert offsets(pool.store, lease.run_id) == []  # left to the exchange
    pool.exchange()
    assert offsets(pool.store, lease.run_id) == list(range(1, BATCH + 1))
    assert pool.thread_store.appends == 0  # the conductor's connection wrote it
    ctx.emit("the end")
    ctx.flush()  # a flush writes now, on the thread: no exchange comes
    assert offsets(pool.store, lease.run_id) == list(range(1, BATCH + 2))
    assert pool.thread_store.appends == 1


def test_a_batch_the_exchange_could_not_write_goes_back_to_the_thread(pool: Pool) -> None:
    pool.store.start_runs([{"task": "answer"}, {"task": "other"}])
    (lease,) = pool.exchange()
    ctx = pool.context(lease)
    for i in range(BATCH):
        ctx.emit(f"{i} ")
    pool.store.failures = 1  # the next exchange fails: a claim alone is not tried again
    assert pool.exchange() == ()
    wait_for(lambda: len(offsets(pool.store, lease.run_id)) == BATCH, timeout=30,
             what="the batch written by the thread")  # fmt: skip
    assert pool.thread_store.appends == 1
    ctx.emit("more")
    ctx.flush()
    assert [c.data for c in pool.store.stream(lease.run_id)][-2:] == [f"{BATCH - 1} ", "more"]


def test_a_zombies_batch_in_an_exchange_is_refused_and_it_learns_at_its_next_emit(
    pool: Pool, clock: FakeClock
) -> None:
    pool.store.start_runs([{"task": "answer"}])
    (old,) = pool.exchange("zombie")
    zombie = pool.context(old)
    zombie.emit("draft")
    zombie.flush()
    clock.advance(TTL + 1)
    other = Counted(pool.store)  # another worker takes the task over
    (new,) = other.commit_many([], claim=ClaimRequest("w2", TTL)).leases
    assert new.run_id == old.run_id
    for i in range(BATCH):
        zombie.emit(f"late {i}")
    pool.exchange()  # writes the zombie's batch: refused
    with pytest.raises(LeaseLost):
        zombie.emit("later")
    assert [c.data for c in pool.store.stream(old.run_id)] == ["draft"]
    assert [r.op for r in pool.store.fence_rejections()] == ["emit"]
