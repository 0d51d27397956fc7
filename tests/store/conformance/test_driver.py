"""The driver's verbs (``workerproc/store/driver.py``), each run inside a write transaction of
the store's own dialect, on both drivers: what each one writes or reads (typed rows), and the
order its contract promises (a write that waits for the gates goes before the transaction's
next look at them; a claim's write-back goes before a later placement)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from workerproc.store.dialect import Tx
from workerproc.store.driver import (
    ClaimAsk,
    GateSettle,
    LeaseRuns,
    LineRun,
    Opened,
    Placing,
    RenewAsk,
    RenewRow,
)
from workerproc.store.limits import GateState
from workerproc.store.protocol.gates import Admission

from .kit import TTL, Driver, verb
from .test_limits import ONE, gated

T = TypeVar("T")


def write(driver: Driver, fn: Callable[[Tx], T]) -> T:
    return driver.store.dialect.write(fn)


def open_now(driver: Driver) -> list[str]:
    return write(driver, lambda tx: tx.open_gates(None, 0, 64).gates)


def closed(driver: Driver, ready_at: float | None) -> list[int]:
    """Runs of ``call`` waiting in the line of gate ``api``, the gate then closed until
    ``ready_at`` (None: nothing waits) by a claim's write-back."""
    gated(driver, ONE)
    runs = [driver.store.start_run("call") for _ in range(3)]
    assert open_now(driver) == ["api"]  # the runs joined the line: it may admit now

    def close(tx: Tx) -> None:
        (row,) = tx.look_gates(["api"]).states
        state = GateState.of(row)
        state.decide(ready_at)
        tx.write_gates([state], driver.clock())

    write(driver, close)
    assert open_now(driver) == []
    return runs


@verb("Driver.look_gates")
def test_look_gates_reads_states_and_each_lines_first_runs_together(driver: Driver) -> None:
    gated(driver, ONE)
    runs = [driver.store.start_run("call") for _ in range(3)]
    look = write(driver, lambda tx: tx.look_gates(["api", "nobody"], ["api", "empty"], None, 2))
    (state,) = look.states  # a gate without a row has no state
    assert GateState.of(state).gate == "api" and GateState.of(state).concurrency == 1
    assert [run.run_id for run in look.runs["api"]] == runs[:2]  # the line's order, limited
    assert look.runs["empty"] == []  # every line asked has its list
    first = look.runs["api"][0]
    assert isinstance(first, LineRun) and first.gates == ("api",) and first.before is None
    assert write(driver, lambda tx: tx.look_gates(["api"], ["api"], ["elsewhere"], 5)).runs == {
        "api": []
    }  # the served queues only


def test_a_claims_line_runs_are_typed_rows_of_their_lines_in_order(driver: Driver) -> None:
    """What a gated claim reads of its lines (``Admission.line_runs``): typed rows, each
    naming its line, in the order of the lines asked; the first look's runs taken once."""
    gated(driver, ONE)
    runs = [driver.store.start_run("call") for _ in range(3)]

    def look(tx: Tx) -> tuple[list[LineRun], list[LineRun]]:
        gates = Admission(tx, driver.clock(), TTL)
        gates.first_look(["api"], None, 1)
        return gates.line_runs(["empty", "api"], None, 1), gates.line_runs(["api"], None, 2)

    first, again = write(driver, look)
    assert all(isinstance(row, LineRun) for row in first + again)
    assert [(row.line, row.run_id) for row in first] == [("api", runs[0])]
    assert [(row.line, row.run_id) for row in again] == [("api", run) for run in runs[:2]]


@verb("Driver.write_gates", "Driver.open_gates")
def test_write_gates_closes_a_line_until_its_time(driver: Driver) -> None:
    closed(driver, driver.clock() + 100)
    driver.clock.advance(101)
    opened = write(driver, lambda tx: tx.open_gates(None, 0, 64))
    assert isinstance(opened, Opened) and opened.gates == ["api"] and opened.held == []
    assert opened.now == driver.clock()  # the moment the claim stands at
    assert write(driver, lambda tx: tx.open_gates(None, 0, 0).gates) == []  # limit 0: none


@verb("Driver.settle_gates", "Driver.open_gates")
def test_settle_gates_goes_before_the_next_look_and_is_read_with_it(driver: Driver) -> None:
    runs = closed(driver, None)

    def settle_then_open(tx: Tx) -> Opened:
        tx.settle_gates([GateSettle("api")])  # a lease ended: its gate may admit now
        return tx.open_gates(None, 2, 64)

    opened = write(driver, settle_then_open)
    assert opened.gates == ["api"] and opened.held == ["api"] and opened.limit == 2
    (state,) = opened.states
    assert GateState.of(state).gate == "api"
    assert [run.run_id for run in opened.runs["api"]] == runs[:2]
    assert open_now(driver) == ["api"]


@verb("Driver.settle_gates")
def test_settle_gates_is_written_by_the_commit_when_nothing_looks(driver: Driver) -> None:
    closed(driver, None)
    write(driver, lambda tx: tx.settle_gates([GateSettle("api", pause=None)]))
    assert open_now(driver) == ["api"]


@verb("Driver.reopen_runs")
def test_reopen_runs_opens_the_runs_lines_before_the_next_look(driver: Driver) -> None:
    runs = closed(driver, None)

    def reopen_then_open(tx: Tx) -> list[str]:
        tx.reopen_runs(runs[:1])
        return tx.open_gates(None, 0, 64).gates

    assert write(driver, reopen_then_open) == ["api"]
    write(driver, lambda tx: tx.reopen_runs([]))  # none: nothing written


@verb("Driver.place_gates")
def test_place_gates_comes_after_a_claims_write_back(driver: Driver) -> None:
    closed(driver, driver.clock() + 100)

    def write_back_then_place(tx: Tx) -> None:
        (row,) = tx.look_gates(["api"]).states
        state = GateState.of(row)
        state.decide(None)  # the claim found nothing due: the line waits for a new run
        tx.write_gates([state], driver.clock())
        tx.place_gates(Placing(("api",), ("api",)))  # ... and one joined it: open now

    write(driver, write_back_then_place)
    assert open_now(driver) == ["api"]


@verb("Driver.claim_rows")
def test_claim_rows_leases_runs_of_the_served_queues_one_each(driver: Driver) -> None:
    s = driver.store
    ours = [s.start_run("t", queue="q") for _ in range(3)]
    other = s.start_run("t")
    rows = write(driver, lambda tx: tx.claim_rows(ClaimAsk("w1", TTL, 2, ("q",))))
    assert [(row.run_id, row.queue, row.attempts) for row in rows] == [
        (ours[0], "q", 1), (ours[1], "q", 1)]  # fmt: skip
    assert all(row.task_id is not None and row.expires_at == driver.clock() + TTL for row in rows)
    rows = write(driver, lambda tx: tx.claim_rows(ClaimAsk("w1", TTL, 5, skip=("q",))))
    assert [row.run_id for row in rows] == [other]  # every queue but those skipped
    rows = write(driver, lambda tx: tx.claim_rows(ClaimAsk("w2", TTL, 5)))
    assert [row.run_id for row in rows] == [ours[2]]  # one lease per run (R1)
    assert write(driver, lambda tx: tx.claim_rows(ClaimAsk("w2", TTL, 5))) == []


@verb("Driver.lease_runs")
def test_lease_runs_leases_the_admitted_runs_with_their_gates(driver: Driver) -> None:
    gated(driver, ONE)
    runs = [driver.store.start_run("call") for _ in range(2)]
    ask = LeaseRuns(tuple(runs), "w1", TTL)
    rows = write(driver, lambda tx: tx.lease_runs(ask))
    assert sorted(row.run_id for row in rows) == runs
    assert all(row.task_id is not None and row.gate_a == "api" for row in rows)
    assert driver.store.limits()[0].in_use == 2  # the admission was the caller's to make
    assert [row.task_id for row in write(driver, lambda tx: tx.lease_runs(ask))] in (
        [], [None, None])  # fmt: skip  # leased already: none leased again


@verb("Driver.renew_leases")
def test_renew_leases_answers_each_live_lease_renewed(driver: Driver) -> None:
    old, new = driver.zombie()
    mine = driver.lease("u", owner="w2")
    driver.clock.advance(10)
    ask = RenewAsk((new, mine), "w2", TTL, starting=(mine.task_id,))
    rows = write(driver, lambda tx: tx.renew_leases(ask))
    expected = {RenewRow(x.task_id, x.attempt, driver.clock() + TTL, True) for x in (new, mine)}
    assert set(rows) == expected
    assert write(driver, lambda tx: tx.renew_leases(RenewAsk((old,), "zombie", TTL))) == []
    assert driver.store.cancel_run(mine.run_id)
    (row,) = write(driver, lambda tx: tx.renew_leases(RenewAsk((mine,), "w2", TTL)))
    assert row.task_id == mine.task_id and not row.alive  # cancelled under its holder (B15)
