"""Review reproducers for the writer's wake-ups (``Streamer._next``, ``landed``) and ``add``'s
lock-free case: the writer driven by hand on a clock the test moves, its sleeps recorded."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from test_emitter import LEASE, Kept

from workerproc import streaming
from workerproc.store.streams import Appended
from workerproc.streaming import BATCH, DELAY, Emitter, Streamer


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class Sleeps(threading.Condition):
    """The writer's ``wake``: each sleep recorded and over at once; ``during`` runs inside the
    next sleep (what another thread does while the writer sleeps); notifications counted."""

    def __init__(self, streamer: Streamer) -> None:
        super().__init__(streamer.cond._lock)  # type: ignore[attr-defined]
        self.slept: list[float] = []
        self.during: Callable[[], None] | None = None
        self.notified = 0

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.slept.append(timeout)
        during, self.during = self.during, None
        if during is not None:
            during()
        return False

    def notify(self, n: int = 1) -> None:
        self.notified += 1


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(streaming, "time", c)
    return c


def by_hand() -> tuple[Streamer, Sleeps, Emitter]:
    streamer = Streamer(Kept)
    streamer.wake = sleeps = Sleeps(streamer)
    streamer._thread = threading.current_thread()  # no writer thread: the test is the writer
    return streamer, sleeps, streamer.emitter(LEASE)


def test_the_writer_does_not_spin_while_a_slow_exchange_holds_a_batch(clock: Clock) -> None:
    streamer, sleeps, em = by_hand()
    for i in range(10):
        em.add(f'"{i}"')
    clock.t += DELAY * 1.2
    lent = streamer.lend()  # an exchange takes the due batch ...
    assert [len(b) for _, b in lent] == [10]
    em.add('"behind"')
    clock.t += 0.2  # ... and is still running 200 ms later (a busy database, a retry)
    with streamer.cond:
        assert streamer._next() is None
    assert sleeps.slept[-1] >= DELAY / 2, (
        f"the writer sleeps {sleeps.slept[-1] * 1000:g} ms at a time while the exchange runs: "
        "it spins on a batch it cannot take"
    )


def test_chunks_behind_a_slow_exchange_go_when_it_answers(clock: Clock) -> None:
    streamer, sleeps, em = by_hand()
    for i in range(10):
        em.add(f'"{i}"')
    clock.t += DELAY * 1.2
    lent = streamer.lend()
    em.add('"behind"')  # due at the take's time + DELAY
    clock.t += 2.0  # the exchange takes 2 s (the stream no longer lively)
    sleeps.during = lambda: streamer.landed(lent, (Appended("written", 10),))
    with streamer.cond:
        assert streamer._next() is None
    # the writer sleeps past the chunk's due time (overdue by 1.95 s already) unless woken
    assert sleeps.notified >= 1 or sleeps.slept[-1] <= DELAY, (
        f"the writer sleeps {sleeps.slept[-1]:g} s past an overdue chunk and is not woken"
    )


def test_a_real_writer_wakes_a_few_times_during_a_slow_exchange() -> None:
    streamer = Streamer(Kept)
    em = streamer.emitter(LEASE)
    waits = [0]
    wait = streamer.wake.wait

    def counted(timeout: float | None = None) -> bool:
        waits[0] += 1
        return wait(timeout)

    streamer.wake.wait = counted  # type: ignore[method-assign]
    streamer._lent_at = time.monotonic()  # riding: the next exchange takes the full batch
    for i in range(BATCH):
        em.add(f'"{i}"')
    lent = streamer.lend()
    assert [len(b) for _, b in lent] == [BATCH]
    em.add('"behind"')
    time.sleep(DELAY + 0.01)  # the chunk behind is overdue while the exchange runs
    before = waits[0]
    time.sleep(0.3)  # the exchange runs 300 ms more
    during = waits[0] - before
    streamer.landed(lent, (Appended("written", BATCH),))
    streamer.close(timeout=30)
    assert during <= 20, f"the writer woke {during} times in 300 ms of one exchange"


def test_a_refused_emitters_late_chunk_does_not_spin_the_writer_before_its_end(
    clock: Clock,
) -> None:
    streamer, sleeps, em = by_hand()
    for i in range(3):
        em.add(f'"{i}"')
    with streamer.cond:
        streamer._answered(em, [], Appended("lost"))
    em.waiting.append('"late"')  # appended without the condition as the refusal came
    clock.t += 2.0  # the handler works on without emitting: its execution not ended
    with streamer.cond:
        assert streamer._next() is None
    assert sleeps.slept[-1] >= DELAY / 2, "the writer spins on a chunk nobody will write"
