"""Debounced starts (``start_run(..., key=K, debounce=S)``): a burst of starts with one key is
one run, which takes the last start's payload and starts ``S`` seconds after the last start; a
run that began is never touched (the next start makes a new run, which takes the key); bad
values are refused and write nothing."""

from __future__ import annotations

import asyncio

import pytest

from workerproc.store import CasResult, InvalidPayload
from workerproc.store import open_async_store as open_async

from .kit import Driver, last_word, verb


@verb("start_run")
def test_a_burst_of_starts_is_one_run_with_the_last_payload(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    first = s.start_run("digest", {"n": 1}, {"s": 0}, key="user-42", debounce=30)
    for n in (2, 3):
        clock.advance(10)
        assert s.start_run("digest", {"n": n}, {"s": n}, key="user-42", debounce=30) == first
    (task,) = s.get_tasks(first)
    assert task.payload == {"n": 3} and task.available_at == clock.now + 30
    assert s.get_run(first).state == {"s": 0}  # type: ignore[union-attr]  # (the payload only)
    clock.advance(29)
    assert s.claim("w", 60) is None  # pushed back by each start
    clock.advance(1)
    lease = s.claim("w", 60)
    assert lease is not None and (lease.run_id, lease.payload) == (first, {"n": 3})
    assert [e.kind for e in s.events(run=first)] == ["run.enqueued", "step.claimed"]


@verb("start_run")
def test_a_run_that_began_is_left_alone_and_a_new_run_takes_the_key(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    first = s.start_run("digest", {"n": 1}, key="k", debounce=5)
    clock.advance(5)
    lease = driver.claim("w")
    assert lease.run_id == first
    second = s.start_run("digest", {"n": 2}, key="k", debounce=5)
    assert second != first
    assert (s.get_run(first).key, s.get_run(second).key) == (None, "k")  # type: ignore[union-attr]
    assert lease.payload == {"n": 1} and s.get_tasks(first)[0].payload == {"n": 1}
    assert driver.commit(last_word(lease, "finish")) is CasResult.OK
    assert s.start_run("digest", {"n": 3}, key="k", debounce=5) == second  # still pending
    assert s.get_tasks(second)[0].payload == {"n": 3}
    assert s.start_run("digest", {"n": 4}, key="k") == second  # a plain start finds it


@verb("start_run")
def test_a_handed_back_claim_counts_as_begun(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    first = s.start_run("digest", {"n": 1}, key="k", debounce=5)
    clock.advance(5)
    lease = driver.claim("w")
    assert driver.commit(last_word(lease, "handback")) is CasResult.OK
    assert s.start_run("digest", {"n": 2}, key="k", debounce=5) != first


@verb("start_runs")
def test_debounced_items_of_one_batch_make_one_run(driver: Driver) -> None:
    s = driver.store
    ids = s.start_runs([{"task": "t", "payload": n, "key": "k", "debounce": 10} for n in range(3)]
                       + [{"task": "t", "payload": "plain"}])  # fmt: skip
    assert ids[0] == ids[1] == ids[2] != ids[3]
    assert s.get_tasks(ids[0])[0].payload == 2


@verb("start_run", "start_runs")
def test_a_bad_debounce_is_refused_and_writes_nothing(driver: Driver) -> None:
    s = driver.store
    for call in (lambda: s.start_run("t", debounce=5),  # no key
                 lambda: s.start_run("t", key="k", debounce=0),
                 lambda: s.start_run("t", key="k", debounce=float("nan")),
                 lambda: s.start_run("t", key="k", debounce=True),
                 lambda: s.start_runs([{"task": "t", "key": "k", "debounce": "x"}])):  # fmt: skip
        with pytest.raises(InvalidPayload, match="debounce"):
            call()
    assert s.list_runs() == []


@verb("AsyncStore.start_run")
def test_the_async_store_debounces_as_the_store_does(driver: Driver) -> None:
    async def body() -> tuple[int, int]:
        async with await open_async(driver.backend.url, clock=driver.clock) as a:
            first = await a.start_run("digest", {"n": 1}, key="k", debounce=30)
            driver.clock.advance(10)
            return first, await a.start_run("digest", {"n": 2}, key="k", debounce=30)

    first, again = asyncio.run(body())
    assert first == again
    (task,) = driver.store.get_tasks(first)
    assert task.payload == {"n": 2} and task.available_at == driver.clock.now + 30
