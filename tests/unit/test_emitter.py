"""The emit path's own parts (``streaming.Emitter``, ``chunk_text``), with a store that keeps
batches in memory: a text chunk's JSON is the encoder's own; a chunk appended without the
condition (``add``'s common case) is never lost, duplicated or left unannounced when the writer
takes a batch at the same moment; and a refused emitter holding a chunk that came after its
refusal neither keeps the writer busy nor holds up its close."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest
from helpers import wait_for
from hypothesis import given, settings
from hypothesis import strategies as st

from workerproc import streaming
from workerproc.store import InvalidPayload, Lease, Run
from workerproc.store.codec import dumps
from workerproc.store.protocol.streams import chunk_text
from workerproc.store.streams import MAX_CHUNK, Appended
from workerproc.store.types import JSON
from workerproc.streaming import BATCH, Emitter, Streamer

LEASE = Lease(task_id=1, run_id=1, task="t", payload=None, attempt=1, owner="w",
              expires_at=1e12, claimed_at=0.0)  # fmt: skip


class Kept:
    """A stream store that keeps every batch in memory, in the order written."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.lock = threading.Lock()

    def append_stream(
        self, lease: Lease, texts: Sequence[str], *, after: int | None = None
    ) -> Appended:
        with self.lock:
            self.batches.append(list(texts))
            return Appended("written", sum(map(len, self.batches)))

    def emitted(self, lease: Lease) -> list[JSON]:
        return []

    def drop_expired_streams(self, limit: int = 100) -> int:
        return 0

    def get_run(self, run_id: int) -> Run | None:
        return None

    def close(self) -> None:
        pass


class Counting(threading.Condition):
    """The writer's condition (``Streamer.wake``, on the streamer's lock), counting the times
    the writer is woken."""

    def __init__(self, streamer: Streamer) -> None:
        super().__init__(streamer.cond._lock)  # type: ignore[attr-defined]
        self.notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)

    def notify_all(self) -> None:
        self.notified += 1
        super().notify_all()


@given(st.text(max_size=200))
@settings(max_examples=300)
def test_a_text_chunk_is_the_encoders_own_json(text: str) -> None:
    assert chunk_text(text) == dumps(text, "a stream chunk", MAX_CHUNK)


def test_a_text_chunk_over_the_limit_is_refused_with_its_size() -> None:
    fits = MAX_CHUNK // 6  # "\u00e9" is 6 bytes of JSON, and the quotes 2
    assert len(chunk_text("\u00e9" * fits)) == 6 * fits + 2 <= MAX_CHUNK
    with pytest.raises(InvalidPayload, match=r"a stream chunk is 65,540 bytes of JSON, over"):
        chunk_text("\u00e9" * (fits + 1))
    with pytest.raises(InvalidPayload, match="over the limit"):
        chunk_text(["x" * MAX_CHUNK])  # any other value goes through the codec, as before


class TakenBetween(list[str]):
    """An emitter's ``waiting`` where the writer takes a batch between ``add``'s look and its
    append, once (what a thread switch at that moment does)."""

    def __init__(self, emitter: Emitter) -> None:
        super().__init__()
        self.emitter, self.armed = emitter, False

    def append(self, text: str) -> None:
        if self.armed:
            self.armed = False
            with self.emitter._streamer.cond:
                self.emitter.busy = 0
                self.taken_batch = self.emitter.take(time.monotonic())
        super().append(text)


def test_a_take_between_the_look_and_the_append_is_told_to_the_writer() -> None:
    streamer = Streamer(Kept)
    streamer.wake = woken = Counting(streamer)
    em = streamer.emitter(LEASE)
    racing = TakenBetween(em)
    em.waiting = racing
    streamer._thread = threading.current_thread()  # no writer thread: this test takes
    streamer._asleep_until = time.monotonic() + 600  # as a writer with nothing to do sleeps
    em.add('"a"')  # the slow path: the first chunk of a batch, due in DELAY: woken
    em.add('"b"')  # the common case, no take meanwhile: the writer knows already
    assert woken.notified == 1 and em.waiting == ['"a"', '"b"']
    racing.armed = True
    taken_at = time.monotonic()
    em.add('"c"')  # the writer takes "a" and "b" in between: "c" waits alone, from the take
    assert racing.taken_batch == ['"a"', '"b"'] and em.waiting == ['"c"']
    assert woken.notified == 2  # the writer learns when it is due
    assert em.since >= taken_at and em.taken == 1


def test_batches_that_ride_the_exchanges_wake_the_writer_a_few_times_not_at_each_batch() -> None:
    kept = Kept()
    streamer = Streamer(lambda: kept)
    streamer.wake = woken = Counting(streamer)
    em = streamer.emitter(LEASE)
    stop = threading.Event()
    lent: list[list[str]] = []

    def exchanges() -> None:  # a busy conductor: an exchange every 2 ms, each writing what it took
        while not stop.is_set():
            taken = streamer.lend()
            lent.extend(batch for _, batch in taken)
            streamer.landed(taken, tuple(Appended("written", 1) for _ in taken))
            time.sleep(0.002)

    conductor = threading.Thread(target=exchanges)
    conductor.start()
    try:
        wait_for(lambda: streamer._lent_at > 0, timeout=30, what="the first exchange")
        for i in range(40 * BATCH):  # 40 batches, each full in about 6 ms
            em.add(f'"{i}"')
            if i % 100 == 99:
                time.sleep(0.01)
        wait_for(lambda: not em.waiting and not em.busy, timeout=30, what="every batch taken")
    finally:
        stop.set()
        conductor.join(30)
    streamer.close()
    assert [int(t.strip('"')) for b in lent + kept.batches for t in b] == list(range(40 * BATCH))
    assert len(kept.batches) <= 2, "batches an exchange would have taken went on their own"
    assert woken.notified <= 10, f"the writer was woken {woken.notified} times for 40 batches"


def test_chunks_emitted_by_many_threads_at_once_are_each_written_once_in_each_threads_order() -> (
    None
):
    kept = Kept()
    streamer = Streamer(lambda: kept)
    em = streamer.emitter(LEASE)
    threads, per = 4, 5_000
    start = threading.Barrier(threads)

    def emit(k: int) -> None:
        start.wait()
        for i in range(per):
            em.add(f'"{k}:{i}"')

    workers = [threading.Thread(target=emit, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    em.flush()
    streamer.close()
    written = [text for batch in kept.batches for text in batch]
    assert len(written) == len(set(written)) == threads * per
    for k in range(threads):
        mine = [int(t.strip('"').split(":")[1]) for t in written if t.startswith(f'"{k}:')]
        assert mine == list(range(per))
    assert all(len(batch) <= 1024 for batch in kept.batches)


def test_a_refused_emitter_with_a_late_chunk_neither_spins_the_writer_nor_holds_up_close() -> None:
    streamer = Streamer(Kept)
    em = streamer.emitter(LEASE)
    for i in range(BATCH // 2):
        em.add(f'"{i}"')
    em.flush()
    with streamer.cond:
        streamer._answered(em, [], Appended("lost"))  # its next batch was refused
    em.waiting.append('"late"')  # a chunk appended, without the condition, as it was refused
    streamer.detach(em)
    began = time.monotonic()
    streamer.close(timeout=30)
    assert time.monotonic() - began < 5, "close waited for a chunk nobody will write"
    with pytest.raises(Exception, match="lost"):
        em.add('"again"')


def test_a_flush_behind_a_batch_an_exchange_carries_goes_once_the_exchange_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(streaming, "DELAY", 600.0)  # nothing goes by time in this test
    kept = Kept()
    streamer = Streamer(lambda: kept)
    em = streamer.emitter(LEASE)
    for i in range(BATCH):
        em.add(f'"{i}"')
    taken = streamer.lend()  # an exchange takes the full batch: it is being written
    assert [len(batch) for _, batch in taken] == [BATCH]
    em.add('"behind"')
    flushed = threading.Event()

    def flush() -> None:
        em.flush()
        flushed.set()

    flusher = threading.Thread(target=flush)
    flusher.start()
    wait_for(lambda: em.flushing, timeout=30, what="the flush waiting")
    with streamer.cond:  # the writer asleep (the chunk cannot go while the batch is written)
        streamer.wake = woken = Counting(streamer)
    wait_for(lambda: streamer._asleep_until > 0, timeout=30, what="the writer asleep")
    streamer.landed(taken, (Appended("written", BATCH),))
    assert woken.notified == 1  # the writer learns at once, not at its next look
    assert flushed.wait(30), "the flush waited for the chunk behind the exchange's batch"
    flusher.join(30)
    streamer.close()
    assert kept.batches == [['"behind"']]
