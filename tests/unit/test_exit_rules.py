"""What decides ``supervisor start``'s exit code once its loop is done (``exit_rules``): a chaos
violation (8) wins over ``--fail-on-failed`` (16), and ``--fail-on-failed`` judges only a drain
that finished. The loop's exit hooks on an arbiter the test drives, with the fake clock and a
real store."""

from __future__ import annotations

from pathlib import Path

from chaos_fakes import TTL, StoreGate
from helpers import FakeClock
from supervisor_fakes import FakeProcs, make_arbiter

from supervisor import exitcodes
from supervisor.chaos import Chaos
from supervisor.commands.start import exit_rules
from supervisor.config import ChaosConfig
from supervisor.loop.arbiter import Arbiter, Step
from supervisor.loop.failures import drain_began
from supervisor.loop.progress import StallWatch
from workerproc.status import IDLE
from workerproc.store import Commit, Store


def exit_code(arb: Arbiter) -> int:
    """What ``Arbiter.run`` does once the loop is done."""
    code = exitcodes.OK
    for hook in arb.exit_hooks:
        code = hook(arb, code)
    return code


def drain(store: Store, clock: FakeClock) -> Arbiter:
    arb = make_arbiter(clock, FakeProcs(), workers=2, lease_ttl=TTL, drain=True,
                       fail_on_failed=True)  # fmt: skip
    arb.gate = StoreGate(store)  # type: ignore[assignment]
    drain_began(arb)
    run_id = store.start_run("t")  # a run fails during the drain
    lease = store.claim("w", 60.0)
    assert lease is not None and lease.run_id == run_id
    assert store.commit_many([Commit(lease, "fail", reason="broken", error="E")]).failed
    return arb


def test_a_chaos_violation_wins_over_fail_on_failed(store: Store, clock: FakeClock) -> None:
    """``--chaos --drain --fail-on-failed``: a drain that finished with a failed run and a
    chaos violation (here ``no_progress``) exits 8. The drain's hook ran first and its 16 was
    kept by chaos, which keeps any code that is not 0."""
    arb = drain(store, clock)
    arb.app.task("t")(lambda ctx: None)  # the pool serves it (B22): its drain waits for it
    store.start_run("t")  # ready, and never claimed: the pool makes no progress
    chaos = Chaos(ChaosConfig(enabled=True, interval=3600.0), ttl=TTL, poll_interval=0.2,
                  fast_release=True, max_attempts=3, wall=clock)  # fmt: skip
    chaos.install(arb)
    arb.add_step(Step("progress", StallWatch().step), before="publish")
    arb.turn()
    for w in arb.pool.workers.values():  # free, and never a claim while work is ready
        arb.board.slot(w.slot).publish(w.pid, IDLE)
    for _ in range(13):
        clock.advance(1.0)
        arb.turn()
    arb.drain_failed = 1  # as if the drain had finished, and counted the failed run
    exit_rules(arb, chaos)
    assert exit_code(arb) == exitcodes.CHAOS_VIOLATION
    assert any(v.startswith("no_progress") for v in chaos.report()["violations"])


def test_fail_on_failed_exits_16_for_a_finished_drain(store: Store, clock: FakeClock) -> None:
    arb = drain(store, clock)
    arb.drain_failed = 1
    exit_rules(arb, None)
    assert exit_code(arb) == exitcodes.RUNS_FAILED


def test_a_drain_stopped_before_it_finished_is_not_judged(store: Store, clock: FakeClock) -> None:
    """TERM before the drain's last check: it did not finish, so ``--fail-on-failed`` (16 for
    "the drain finished, and a run failed while it ran") does not apply; it used to count then
    and exit 16."""
    arb = drain(store, clock)
    assert arb.drain_failed is None
    exit_rules(arb, None)
    assert exit_code(arb) == exitcodes.OK


def test_a_damaged_database_at_the_drains_end_exits_17_over_16(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    """The quick check that ends a finished drain found damage: 17, which wins over
    ``--fail-on-failed``'s 16; a drain not finished is not checked."""
    arb = drain(store, clock)
    arb.gate.file = str(tmp_path / "lk.db")  # type: ignore[misc]  # an SQLite file, small
    checks: list[int] = []

    def quick_check() -> list[str]:
        checks.append(1)
        return ["Tree 7 page 12: btreeInitPage() returns error code 11"]

    arb.gate.quick_check = quick_check  # type: ignore[method-assign]
    exit_rules(arb, None)
    assert exit_code(arb) == exitcodes.OK and checks == []  # not finished: not checked
    arb.drain_failed = 1
    assert exit_code(arb) == exitcodes.DRAIN_CORRUPT and checks == [1]
