"""Debounced starts under 20 producers at once, each with its own connection, on both backends
(real database time, real locks): a burst with one key is one run, whatever the interleaving;
with a worker claiming and finishing runs meanwhile, every start lands in a run, each run ran
with the payload of a start that named it, and the key is held by one run at most."""

from __future__ import annotations

import threading
from collections import defaultdict

from store_backends import Backend

from workerproc.store import Commit

PRODUCERS = 20
STARTS = 10  # each


def burst(backend: Backend, answers: dict[tuple[int, int], int], debounce: float) -> None:
    """Every producer starts ``STARTS`` runs of one key, at once; ``answers``: each start's
    run id, by (producer, start)."""
    go = threading.Barrier(PRODUCERS)
    lock = threading.Lock()
    failures: list[BaseException] = []

    def produce(p: int) -> None:
        try:
            with backend.open() as store:
                go.wait(30)
                for i in range(STARTS):
                    run_id = store.start_run("digest", {"p": p, "i": i}, key="user-42",
                                             debounce=debounce)  # fmt: skip
                    with lock:
                        answers[(p, i)] = run_id
        except BaseException as exc:  # (reported by the test thread)
            failures.append(exc)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(PRODUCERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures
    assert len(answers) == PRODUCERS * STARTS


def test_twenty_producers_make_one_run_of_a_key(backend: Backend) -> None:
    answers: dict[tuple[int, int], int] = {}
    burst(backend, answers, debounce=3600)  # nothing begins: every start is the same run
    (run_id,) = set(answers.values())
    with backend.open() as store:
        (task,) = store.get_tasks(run_id)
        assert len(store.list_runs()) == 1
        assert (task.payload["p"], task.payload["i"]) in answers  # one start's, whole


def test_with_a_worker_claiming_every_start_lands_in_a_run_that_ran_its_payload(
    backend: Backend,
) -> None:
    answers: dict[tuple[int, int], int] = {}
    ran: dict[int, object] = {}
    stop = threading.Event()

    def work() -> None:
        with backend.open() as store:
            while not stop.is_set():
                lease = store.claim("w", 60)
                if lease is None:
                    stop.wait(0.001)
                    continue
                ran[lease.run_id] = lease.payload
                store.commit_many([Commit(lease, "finish")])

    worker = threading.Thread(target=work)
    worker.start()
    try:
        burst(backend, answers, debounce=0.001)  # each run begins soon after its last start
    finally:
        stop.set()
        worker.join(60)
    named: dict[int, list[object]] = defaultdict(list)
    for (p, i), run_id in answers.items():
        named[run_id].append({"p": p, "i": i})
    with backend.open() as store:
        runs = store.list_runs(limit=10_000)
        assert {r.id for r in runs} == set(named)  # every run was some start's answer
        holders = [r.id for r in runs if r.key == "user-42"]
        assert len(holders) <= 1
        for run_id, payload in ran.items():
            assert payload in named[run_id], (run_id, payload)
        for r in runs:  # a run that never ran holds the payload of a start that named it
            if r.id not in ran:
                assert store.get_tasks(r.id)[0].payload in named[r.id]
