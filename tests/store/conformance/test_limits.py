"""Per-task options and limits (B11, B12): ``register_tasks``, ``task_options``,
``declare_limits``, ``set_limit``, ``limits``, ``repair_lines``; a gate's slot under the claim,
and what a refused commit leaves of it."""

from __future__ import annotations

from pathlib import Path

import pytest

import workerproc.store
from workerproc.store import CasResult, ClaimRequest, InvalidPayload, StoreError, TaskOptions
from workerproc.store.errors import InvalidOption
from workerproc.store.limits import LimitSpec

from .kit import TTL, Driver, verb

ONE = LimitSpec.declare("api", concurrency=1)


def gated(driver: Driver, *specs: LimitSpec, task: str = "call") -> None:
    s = driver.store
    assert s.declare_limits({spec.name: spec for spec in specs}, by="here") == []
    s.register_tasks({task: TaskOptions(limits=tuple(spec.name for spec in specs))})


@verb("register_tasks", "task_options")
def test_register_tasks_writes_only_what_differs(driver: Driver) -> None:
    s = driver.store
    opts = TaskOptions(max_attempts=5, timeout=9.0, queue="q", priority=1)
    assert s.register_tasks({"t": opts, "u": TaskOptions()}) == 1
    assert s.task_options() == {"t": opts}
    assert s.register_tasks({"t": opts}) == 0
    assert s.register_tasks({"t": TaskOptions()}) == 1 and s.task_options() == {}


@verb("register_tasks")
def test_declared_options_apply_in_the_claim(driver: Driver) -> None:
    s = driver.store
    s.register_tasks({"t": TaskOptions(max_attempts=1, timeout=5.0)})
    run_id = s.start_run("t")
    lease = driver.claim("w1", max_attempts=9)
    assert (lease.options.max_attempts, lease.options.timeout) == (1, 5.0)
    driver.clock.advance(TTL + 1)
    out = driver.exchange(claim=ClaimRequest("w2", TTL, max_attempts=9))
    assert out.leases == () and [f.run_id for f in out.failed] == [run_id]  # R6: spent


@verb("register_tasks")
def test_register_tasks_refuses_a_bad_name(driver: Driver) -> None:
    with pytest.raises(InvalidPayload):
        driver.store.register_tasks({"": TaskOptions(max_attempts=2)})
    assert driver.store.task_options() == {}


@verb("declare_limits", "limits")
def test_a_limit_admits_as_many_runs_as_its_concurrency(driver: Driver) -> None:
    s = driver.store
    gated(driver, ONE)
    first, second = s.start_run("call"), s.start_run("call")
    (lease,) = driver.exchange(claim=ClaimRequest("w1", TTL, limit=5)).leases
    assert lease.run_id == first and lease.gates == ("api",)
    assert driver.exchange(claim=ClaimRequest("w1", TTL, limit=5)).leases == ()
    (info,) = s.limits()
    assert (info.name, info.spec.concurrency, info.in_use, info.waiting) == ("api", 1, 1, 1)
    assert info.declared_by == "here"
    assert driver.finish(lease) is CasResult.OK  # its slot goes with its end
    (nxt,) = driver.exchange(claim=ClaimRequest("w1", TTL, limit=5)).leases
    assert nxt.run_id == second


@verb("declare_limits")
def test_a_zombies_refused_commit_frees_no_slot_twice(driver: Driver) -> None:
    s = driver.store
    gated(driver, ONE)
    old, new = driver.zombie("call")  # the takeover holds the one slot
    s.start_run("call")
    assert driver.finish(old) is CasResult.LEASE_LOST
    assert driver.exchange(claim=ClaimRequest("w3", TTL, limit=5)).leases == ()
    assert s.limits()[0].in_use == 1
    assert driver.finish(new) is CasResult.OK
    assert len(driver.exchange(claim=ClaimRequest("w3", TTL, limit=5)).leases) == 1


@verb("declare_limits")
def test_another_hosts_declaration_is_told_and_a_bad_name_refused(driver: Driver) -> None:
    s = driver.store
    gated(driver, ONE)
    told = s.declare_limits({"api": LimitSpec.declare("api", concurrency=2)}, by="there")
    assert len(told) == 1 and "there declares" in told[0]
    assert s.limits()[0].spec.concurrency == 2
    with pytest.raises((ValueError, StoreError)):
        s.declare_limits({"bad name!": LimitSpec("bad name!", concurrency=1)}, by="here")


@verb("set_limit")
def test_set_limit_changes_only_the_numbers_given(driver: Driver) -> None:
    s = driver.store
    gated(driver, LimitSpec.declare("api", concurrency=1, rate=5))
    spec = s.set_limit("api", concurrency=3)
    assert (spec.concurrency, spec.rate) == (3, 5.0)
    (info,) = s.limits()
    assert info.spec.concurrency == 3 and info.overrides == {"concurrency": 3}
    assert s.set_limit("api", rate=0).rate is None  # 0 lifts a dimension


@verb("set_limit")
def test_set_limit_refuses_unknown_limits_names_and_values(driver: Driver) -> None:
    s = driver.store
    with pytest.raises(StoreError):
        s.set_limit("nope", concurrency=1)
    gated(driver, ONE)
    with pytest.raises(InvalidOption):
        s.set_limit("api", colour=1)
    with pytest.raises(InvalidOption):
        s.set_limit("api", concurrency=0)  # it would limit nothing
    with pytest.raises(InvalidOption):
        s.set_limit("api", concurrency=-5)
    assert s.limits()[0].spec.concurrency == 1


@verb("limits")
def test_limits_lists_nothing_before_a_declaration(driver: Driver) -> None:
    assert driver.store.limits() == []


@verb("repair_lines")
def test_repair_lines_reopens_a_line_left_closed(driver: Driver) -> None:
    s = driver.store
    gated(driver, ONE)
    run_id = s.start_run("call")
    assert s.repair_lines() == []
    driver.backend.tamper("UPDATE gates SET ready_at = NULL WHERE gate = 'api'")
    assert driver.exchange(claim=ClaimRequest("w1", TTL, limit=5)).leases == ()
    (line,) = s.repair_lines()
    assert "limit 'api'" in line and line.endswith("reopened")
    assert s.repair_lines() == []
    assert driver.claim("w1").run_id == run_id


@verb("repair_lines")
def test_repair_lines_places_a_gate_that_had_no_row(driver: Driver) -> None:
    """A line whose gate row is gone is placed again, as a start places it (``starts.joined``,
    the one path of ``PLACE_GATES``), and its run is claimed."""
    s = driver.store
    gated(driver, ONE)
    run_id = s.start_run("call")
    driver.backend.tamper("DELETE FROM gates WHERE gate = 'api'")
    assert driver.exchange(claim=ClaimRequest("w1", TTL, limit=5)).leases == ()
    (line,) = s.repair_lines()
    assert line == "limit 'api': 1 run(s) waiting, its gate had no row: reopened"
    assert s.repair_lines() == []
    assert driver.claim("w1").run_id == run_id


def test_only_the_starts_program_writes_a_placement() -> None:
    """``PLACE_GATES``' parameters are built in one place (``starts.place``): the driver's
    ``place_gates``, a start's gated runs and a repair all go through it."""
    root = Path(workerproc.store.__file__).parent
    naming = sorted(
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if path.parent.name not in ("sqlite", "postgres") and path.name != "dialect.py"
        and '"PLACE_GATES"' in path.read_text()
    )  # fmt: skip
    assert naming == ["starts.py"]
