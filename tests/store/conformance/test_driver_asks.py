"""The driver's verbs a program may ask for (``workerproc/store/asks.py``): ``start_runs``,
``signal`` and ``read_events``, each run inside a transaction of the store's own dialect, on
both drivers: their typed answers, what each one writes (and does not: a signal's event is
the caller's), their fences (a key taken, a run over or missing) and a rollback."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

import pytest

from workerproc.store import CasResult
from workerproc.store.asks import (
    EventRow,
    EventsAsk,
    SignalAsk,
    SignalRow,
    Started,
    StartRuns,
)
from workerproc.store.dialect import Tx
from workerproc.store.newrun import NewRun
from workerproc.store.types import JSON, SYSTEM_RUNS

from .kit import Driver, last_word, verb
from .test_limits import ONE, gated

T = TypeVar("T")


def write(driver: Driver, fn: Callable[[Tx], T]) -> T:
    return driver.store.dialect.write(fn)


def new(
    task: str = "t", payload: JSON = None, *, delay: float = 0, key: str | None = None,
    debounce: float | None = None,
) -> NewRun:  # fmt: skip
    return NewRun.make(task, payload, None, delay, key, "default", 0, "", debounce=debounce)


def start(driver: Driver, *runs: NewRun) -> list[Started]:
    return write(driver, lambda tx: tx.start_runs(StartRuns(runs)))


@verb("Driver.start_runs")
def test_start_runs_inserts_each_run_with_its_task_and_event_in_order(driver: Driver) -> None:
    s = driver.store
    got = start(driver, new("a", {"n": 1}), new("b", {"n": 2}, delay=5))
    assert all(isinstance(x, Started) for x in got) and [x.made for x in got] == [True, True]
    a, b = (x.run_id for x in got)
    assert a < b and s.get_run(a).status == "pending"  # type: ignore[union-attr]
    (task,) = s.get_tasks(b)
    assert (task.name, task.payload, task.available_at) == ("b", {"n": 2}, driver.clock() + 5)
    assert [e.kind for e in s.events(run=a)] == ["run.enqueued"]
    assert start(driver) == []  # none: nothing written


@verb("Driver.start_runs")
def test_start_runs_answers_a_taken_key_with_its_run_and_creates_nothing(driver: Driver) -> None:
    s = driver.store
    first = s.start_run("t", {"n": 1}, key="k")
    got = start(driver, new("t", {"n": 2}, key="k"), new("t", key="j"), new("t", key="j"))
    assert got[0] == Started(first, False)
    assert got[1].made and got[2] == Started(got[1].run_id, False)  # an earlier one of the batch
    assert s.get_tasks(first)[0].payload == {"n": 1}  # the key's run as it was
    assert len(s.list_runs()) == 2


@verb("Driver.start_runs")
def test_start_runs_gives_a_debounced_start_to_its_keys_pending_run(driver: Driver) -> None:
    s = driver.store
    first = s.start_run("t", {"n": 1}, key="k", debounce=10)
    driver.clock.advance(4)
    assert start(driver, new("t", {"n": 2}, key="k", debounce=10)) == [Started(first, False)]
    (task,) = s.get_tasks(first)
    assert task.payload == {"n": 2} and task.available_at == driver.clock() + 10
    driver.clock.advance(10)
    lease = driver.claim("w")  # it began: a debounced start makes a new run now
    (later,) = start(driver, new("t", {"n": 3}, key="k", debounce=10))
    assert later.made and later.run_id != lease.run_id


@verb("Driver.start_runs")
def test_start_runs_joins_gated_runs_to_their_lines_and_a_rollback_keeps_none(
    driver: Driver,
) -> None:
    s = driver.store
    gated(driver, ONE)
    (run,) = s.gatekeeper().runs([new("call")])
    assert run.gating.line
    (got,) = start(driver, run)
    assert write(driver, lambda tx: tx.open_gates(None, 0, 64).gates) == ["api"]
    assert driver.claim("w").run_id == got.run_id

    def started_then_failed(tx: Tx) -> None:
        tx.start_runs(StartRuns((new("gone"),)))
        raise RuntimeError("the caller's transaction failed")

    with pytest.raises(RuntimeError):
        write(driver, started_then_failed)
    assert [r.id for r in s.list_runs()] == [got.run_id]


@verb("Driver.signal")
def test_signal_keeps_a_signal_and_resumes_the_wait_that_waits_for_it(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t")
    kept = write(driver, lambda tx: tx.signal(SignalAsk(lease.run_id, "go", '{"x":1}')))
    assert isinstance(kept, SignalRow) and kept.signal_id is not None and not kept.resumed
    assert driver.commit(last_word(lease, "wait")) is CasResult.OK  # takes the kept one
    assert s.get_run(lease.run_id).status == "pending"  # type: ignore[union-attr]
    resumed = driver.claim("w2")
    assert resumed.signal is not None and resumed.signal.payload == {"x": 1}
    again = dataclasses.replace(last_word(resumed, "wait"), expected_revision=resumed.revision)
    assert driver.commit(again) is CasResult.OK
    sent = write(driver, lambda tx: tx.signal(SignalAsk(lease.run_id, "go", "2")))
    assert sent.signal_id is not None and sent.signal_id > kept.signal_id and sent.resumed
    assert driver.claim("w3").signal.payload == 2  # type: ignore[union-attr]  # due at once
    # the verb writes no event: ``run.signalled`` is its caller's (``Store.signal``)
    assert "run.signalled" not in [e.kind for e in s.events(run=lease.run_id)]


@verb("Driver.signal")
def test_signal_to_a_run_that_is_over_or_missing_keeps_nothing(driver: Driver) -> None:
    s = driver.store
    lease = driver.lease("t")
    assert driver.finish(lease) is CasResult.OK
    over = write(driver, lambda tx: tx.signal(SignalAsk(lease.run_id, "go", "null")))
    assert over == SignalRow(None, False, "succeeded")
    missing = write(driver, lambda tx: tx.signal(SignalAsk(lease.run_id + 99, "go", "null")))
    assert missing == SignalRow(None, False, None)
    assert s.run_signals(lease.run_id) == []


@verb("Driver.read_events")
def test_read_events_answers_typed_rows_after_a_cursor(driver: Driver) -> None:
    s = driver.store
    a, b = s.start_run("a"), s.start_run("b")
    newest = s.last_event_id()  # (numbers the committed events where ids are not in order)
    rows = driver.store.dialect.read(lambda tx: tx.read_events(EventsAsk(0, 10, below=SYSTEM_RUNS)))
    assert all(isinstance(r, EventRow) for r in rows)
    assert [(r.run_id, r.kind, r.task) for r in rows] == [(a, "run.enqueued", "a"),
                                                          (b, "run.enqueued", "b")]  # fmt: skip
    assert rows[-1].id == newest and rows[0].id < rows[1].id and rows[0].at == driver.clock()

    def read(ask: EventsAsk) -> list[EventRow]:
        return driver.store.dialect.read(lambda tx: tx.read_events(ask))

    assert read(EventsAsk(rows[0].id, 10, below=SYSTEM_RUNS)) == rows[1:]  # after the cursor
    assert read(EventsAsk(0, 1, below=SYSTEM_RUNS)) == rows[:1]  # the limit
    assert read(EventsAsk(0, 10, run=b)) == rows[1:]  # one run's
    assert read(EventsAsk(0, 10, below=a)) == []  # runs numbered below the bound only
    assert read(EventsAsk(newest, 10, below=SYSTEM_RUNS)) == []  # nothing after the newest
