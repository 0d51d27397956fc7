"""The worker list: ``worker_seen``, ``worker_gone``, ``workers``."""

from __future__ import annotations

import dataclasses

import pytest

from workerproc.store import InvalidPayload, WorkerInfo

from .kit import Driver, verb


def info(owner: str = "host:1:1.0:w", **kw: object) -> WorkerInfo:
    base = WorkerInfo(owner, "host", 1, 1_000_000.0, 5.0, 4, ("a", "b"), "9.9")
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


@verb("worker_seen", "workers")
def test_a_worker_is_listed_and_read_alive_while_it_beats(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    assert s.workers() == []
    s.worker_seen(info(), starting=True)
    s.worker_seen(info("host:2:1.0:w", host="other", queues=None, state="draining"))
    first, second = s.workers()
    assert (first.owner, first.slots, first.queues, first.alive, first.heartbeat_at) == (
        "host:1:1.0:w", 4, ("a", "b"), True, clock.now)  # fmt: skip
    assert (second.queues, second.state) == (None, "draining")
    clock.advance(16)  # silent for more than three of its 5 s periods
    assert [w.alive for w in s.workers()] == [False, False]
    s.worker_seen(info())
    assert [w.alive for w in s.workers()] == [True, False]


@verb("worker_seen")
def test_a_long_silent_worker_goes_when_another_starts(driver: Driver) -> None:
    s = driver.store
    s.worker_seen(info("host:1:1.0:old"), starting=True)
    driver.clock.advance(3600)
    s.worker_seen(info("host:2:1.0:new"), starting=True)
    assert [w.owner for w in s.workers()] == ["host:2:1.0:new"]


@verb("worker_gone")
def test_a_worker_that_stops_cleanly_goes(driver: Driver) -> None:
    s = driver.store
    s.worker_seen(info(), starting=True)
    s.worker_gone("host:1:1.0:w")
    s.worker_gone("never-was")
    assert s.workers() == []


@verb("worker_seen", "worker_gone")
def test_a_bad_owner_is_refused(driver: Driver) -> None:
    s = driver.store
    for owner in ("", "x" * 10_000, "a\x00b"):
        with pytest.raises(InvalidPayload):
            s.worker_seen(info(owner))
        with pytest.raises(InvalidPayload):
            s.worker_gone(owner)
    assert s.workers() == []


@verb("worker_seen")
@pytest.mark.parametrize(
    "bad",
    [
        {"host": "h\x00"},
        {"beat_every": float("nan")},
        {"beat_every": 0.0},
        {"slots": -1},
        {"version": ""},
        {"queues": ("bad queue",)},
    ],
)
def test_worker_seen_refuses_a_value_no_backend_keeps(
    driver: Driver, bad: dict[str, object]
) -> None:
    with pytest.raises(InvalidPayload):
        driver.store.worker_seen(info(**bad))
    assert driver.store.workers() == []
