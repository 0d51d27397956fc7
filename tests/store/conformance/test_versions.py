"""Task versions (B25): a task row keeps the version its run's state is written for; a claim
asks for the versions its claimer serves ("name@v"; a plain name: unversioned runs), so an old
worker never takes a run a newer release moved on; a migration is written under the lease's
fence (a zombie's is refused and recorded), once: a later attempt reads the new version."""

from __future__ import annotations

import dataclasses

import pytest

from workerproc.store import CasResult, ClaimRequest, InvalidPayload, TaskOptions, WorkerInfo
from workerproc.store.limits import LimitSpec

from .kit import TTL, Driver, last_word, verb

OLD = ["summarise", "summarise@1"]  # a release at version 1
NEW = ["summarise", "summarise@1", "summarise@2"]  # version 2, migrating from 1


@verb("start_run", "commit_many")
def test_a_claim_takes_only_the_versions_its_claimer_serves(driver: Driver) -> None:
    s, clock = driver.store, driver.clock
    v2 = s.start_run("summarise", {"n": 2}, version=2)  # started by the new release
    clock.advance(1)
    v1 = s.start_run("summarise", {"n": 1}, version=1)
    clock.advance(1)
    bare = s.start_run("summarise", {"n": 0})  # a producer without the app: unversioned
    got = s.claim("old", TTL, limit=5, tasks=OLD)
    assert sorted((lease.run_id, lease.version) for lease in got) == [(v1, 1), (bare, None)]
    (task,) = s.get_tasks(v2)
    assert (task.attempts, task.lease_owner, task.version) == (0, None, 2)  # untouched
    assert s.claim("old", TTL, limit=5, tasks=OLD) == []
    lease = s.claim("new", TTL, tasks=NEW)
    assert lease is not None and (lease.run_id, lease.version) == (v2, 2)
    assert s.claim("v3-only", TTL, tasks=["summarise@3"]) is None  # (a task at 3, no chain)
    with pytest.raises(InvalidPayload):
        s.start_run("summarise", version=0)
    with pytest.raises(InvalidPayload):
        s.start_run("summarise", version=1_000_001)


@verb("migrate_state")
def test_a_migration_is_written_under_the_fence_and_a_zombie_s_is_refused(
    driver: Driver,
) -> None:
    s, clock = driver.store, driver.clock
    run_id = s.start_run("summarise", state={"text": "hi"}, version=1)
    zombie = s.claim("zombie", TTL, tasks=NEW)
    assert zombie is not None and zombie.version == 1
    clock.advance(TTL + 1)  # its lease lapses; another worker takes the task over
    lease = s.claim("new", TTL, tasks=NEW)
    assert lease is not None and lease.attempt == 2
    refused = s.migrate_state(zombie, 2, {"text": "hi", "lang": "zombie"})
    assert refused is CasResult.LEASE_LOST
    assert [r.op for r in s.run_rejections(run_id)] == ["migrate"]
    assert s.get_tasks(run_id)[0].version == 1
    assert s.migrate_state(lease, 2, {"text": "hi", "lang": "en"}) is CasResult.OK
    run = s.get_run(run_id)
    assert run is not None and (run.state, run.revision) == ({"text": "hi", "lang": "en"}, 1)
    assert s.get_tasks(run_id)[0].version == 2
    # the same lease at its old revision: a moved run, not a lost lease
    assert s.migrate_state(lease, 2, {"x": 1}) is CasResult.CONFLICT
    kinds = [e.kind for e in s.events(after=0) if e.run_id == run_id]
    assert kinds.count("step.migrated") == 1
    # a later attempt reads the new version: nothing to migrate again
    clock.advance(TTL + 1)
    again = s.claim("other", TTL, tasks=NEW)
    assert again is not None and (again.version, again.revision) == (2, 1)
    assert again.state == {"text": "hi", "lang": "en"}


@verb("commit_many")
def test_an_advance_records_its_next_task_s_version(driver: Driver) -> None:
    s = driver.store
    run_id = s.start_run("fetch", version=3)
    lease = s.claim("w", TTL, tasks=["fetch@3"])
    assert lease is not None
    commit = dataclasses.replace(last_word(lease, "advance"), next_task="render", version=2)
    assert s.commit_many((commit,)).results == (CasResult.OK,)
    assert [(t.name, t.version) for t in s.get_tasks(run_id)] == [("fetch", 3), ("render", 2)]
    assert s.claim("w", TTL, tasks=["render", "render@1"]) is None  # an older release's
    nxt = s.claim("w", TTL, tasks=["render@2"])
    assert nxt is not None and (nxt.task, nxt.version) == ("render", 2)


@verb("commit_many", "declare_limits")
def test_a_gated_run_at_a_newer_version_stays_in_its_line(driver: Driver) -> None:
    s = driver.store
    assert s.declare_limits({"api": LimitSpec.declare("api", concurrency=5)}, by="here") == []
    s.register_tasks({"call": TaskOptions(limits=("api",))})
    new = s.start_run("call", version=2)
    old = s.start_run("call", version=1)
    old_claim = ClaimRequest("old", TTL, limit=5, tasks=("call", "call@1"))
    assert [lease.run_id for lease in driver.exchange(claim=old_claim).leases] == [old]
    assert driver.exchange(claim=old_claim).leases == ()
    new_claim = ClaimRequest("new", TTL, limit=5, tasks=("call", "call@1", "call@2"))
    assert [lease.run_id for lease in driver.exchange(claim=new_claim).leases] == [new]


@verb("unserved")
def test_a_run_no_live_worker_serves_at_its_version_is_told_as_such(driver: Driver) -> None:
    s = driver.store
    v2, bare = s.start_run("summarise", version=2), s.start_run("summarise")
    info = WorkerInfo("host:1:1.0:old", "host", 1, 1_000_000.0, 5.0, 4, None, "9.9",
                      tasks=tuple(OLD))  # fmt: skip
    s.worker_seen(info, starting=True)
    assert s.unserved([v2, bare]) == {v2: "no worker serves task summarise version 2"}
    assert s.unserved([v2, bare], tasks=NEW) == {}
    assert s.unserved([v2, bare], tasks=["other", "other@2"]) == {
        v2: "no worker serves task summarise", bare: "no worker serves task summarise"}  # fmt: skip
    # a worker from before versions lists names only: it claims the task at any version
    s.worker_seen(dataclasses.replace(info, owner="host:2:1.0:older", tasks=("summarise",)))
    assert s.unserved([v2, bare]) == {}


@verb("commit_many")
def test_a_batch_claim_gathers_only_the_versions_its_claimer_serves(driver: Driver) -> None:
    s = driver.store
    newer = s.start_run("embed", version=2)
    older = [s.start_run("embed", version=1), s.start_run("embed")]
    ask = ClaimRequest("old", TTL, limit=5, task="embed", tasks=("embed", "embed@1"))
    assert sorted(lease.run_id for lease in driver.exchange(claim=ask).leases) == older
    assert s.get_tasks(newer)[0].attempts == 0
    ask = ClaimRequest("new", TTL, limit=5, task="embed", tasks=("embed@2",))
    assert [lease.run_id for lease in driver.exchange(claim=ask).leases] == [newer]


@verb("fork", "migrate_state")
def test_a_fork_copies_its_step_s_version_with_the_state_it_was_entered_with(
    driver: Driver,
) -> None:
    """B24 x B25: a fork's task carries its step's version, and the input state written for
    it: a migrated step forks at the new version with the migrated state (never the old state
    marked new, nor the new state read as old)."""
    s = driver.store
    plain = s.start_run("summarise", state={"text": "a"}, version=1)
    migrated = s.start_run("summarise", state={"text": "b"}, version=1)
    lease = s.claim("new", TTL, tasks=NEW)
    while lease is not None and lease.run_id != migrated:
        lease = s.claim("new", TTL, tasks=NEW)
    assert lease is not None
    assert s.migrate_state(lease, 2, {"text": "b", "lang": "en"}) is CasResult.OK
    forks = {}
    for source, version, state in ((plain, 1, {"text": "a"}),
                                   (migrated, 2, {"text": "b", "lang": "en"})):  # fmt: skip
        forks[version] = fork = s.fork(source, from_step=1)
        (task,) = s.get_tasks(fork)
        run = s.get_run(fork)
        assert run is not None and (task.version, run.state) == (version, state)
    # an old release takes the version-1 runs (the plain source and its fork), never the
    # migrated step's fork
    taken = {lease.run_id for lease in s.claim("old", TTL, limit=5, tasks=OLD)}
    assert forks[1] in taken and forks[2] not in taken
