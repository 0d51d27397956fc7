"""Flow control in the store, on every backend, with the fake clock: limits kept in
the database and enforced in the claim (concurrency held by live leases, a shared rate bucket,
a token budget settled by the fenced commit), lines that take turns across keys, RetryAfter
that spends no attempt and pauses a limit for everyone, declarations and operators' numbers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from helpers import FakeClock
from limits_helpers import limited
from store_backends import Backend

from workerproc.store import ClaimRequest, Commit, Lease, Store
from workerproc.store.dialect import Params, Row, Tx
from workerproc.store.driver import GateLook
from workerproc.store.limits import LimitSpec

TTL = 30.0


def claims(s: Store, n: int, owner: str = "w") -> list[Lease]:
    return s.claim(owner, TTL, limit=n)


def done(s: Store, lease: Lease, **kw: object) -> None:
    out = s.commit_many([Commit(lease, "finish", expected_revision=lease.revision,
                                new_state={}, **kw)])  # type: ignore[arg-type]  # fmt: skip
    assert out.results[0].value == "ok"


def keys(leases: list[Lease]) -> list[str]:
    return [lease.payload["tenant"] for lease in leases]


class TestConcurrency:
    def test_a_cap_per_key_holds_and_keys_take_turns(self, s: Store) -> None:
        limited(s, LimitSpec.declare("per-tenant", concurrency=2, per="tenant"))
        s.start_runs([{"task": "call", "payload": {"tenant": "A"}}] * 10
                     + [{"task": "call", "payload": {"tenant": "B"}}] * 3)  # fmt: skip
        first = claims(s, 10)
        assert keys(first) == ["A", "B", "A", "B"]  # one each in turn, two each at most
        assert claims(s, 10) == []  # both keys are full: nothing more, however many wait
        done(s, first[0])  # an A slot frees: the next A may go, and nothing else
        assert keys(claims(s, 10)) == ["A"]

    def test_an_expired_lease_frees_its_slot_and_a_takeover_counts_once(
        self, s: Store, clock: FakeClock
    ) -> None:
        limited(s, LimitSpec.declare("cap", concurrency=1))
        s.start_runs([{"task": "call"}] * 3)
        (held,) = claims(s, 5, "dead")
        assert claims(s, 5) == []
        clock.advance(TTL)  # its owner died: the lease expires, the slot with it
        (took,) = claims(s, 5, "w2")
        assert took.run_id == held.run_id and took.takeover  # the orphan goes first, once
        assert claims(s, 5, "w3") == []  # the takeover holds the one slot: never two
        assert s.release_owner("w2") == 1  # a reaped worker: its slot is free at once
        (again,) = claims(s, 5, "w3")
        assert again.run_id == held.run_id and again.attempt == 3

    def test_an_exchange_claims_the_slots_its_own_commits_freed(self, s: Store) -> None:
        # its settles lock the gate first, and its reads of the gate come after them (on
        # PostgreSQL in their round trip): they see its own commits and every other lease
        limited(s, LimitSpec.declare("cap", concurrency=3))
        s.start_runs([{"task": "call"}] * 8)
        first, other = claims(s, 2), claims(s, 5, "other")
        assert len(first) == 2 and len(other) == 1  # the cap: 3
        seen: list[Sequence[str]] = []
        original = Tx.look_gates

        def look_gates(tx: Tx, gates: Sequence[str], *args: Any) -> GateLook:
            seen.append(gates)
            return original(tx, gates, *args)

        finish = [Commit(x, "finish", expected_revision=x.revision, new_state={}) for x in first]
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Tx, "look_gates", look_gates)
            out = s.commit_many(finish, claim=ClaimRequest("w", TTL, 3, 5))
        assert [r.value for r in out.results] == ["ok", "ok"]
        assert len(out.leases) == 2  # the two slots it freed, and not the one still held
        assert seen == []  # the gate it settled was read with its settles, not looked at again
        assert claims(s, 5, "third") == []

    def test_runs_enqueued_before_their_task_had_limits_obey_them(self, s: Store) -> None:
        s.start_runs([{"task": "call"}] * 5)  # no limits yet: in no line
        limited(s, LimitSpec.declare("cap", concurrency=1))  # a release adds one
        got = claims(s, 5) + claims(s, 5)  # the first claim moves them to their line
        assert len(got) == 1 and got[0].gates == ("cap",) and got[0].tries == 1
        assert claims(s, 5) == []

    def test_a_runs_limits_gate_it_alone_and_runs_without_limits_never_wait(self, s: Store) -> None:
        limited(s, LimitSpec.declare("cap", concurrency=1))
        s.start_runs([{"task": "call"}] * 3 + [{"task": "free"}] * 3)
        got = claims(s, 10)
        assert sorted(lease.task for lease in got) == ["call", "free", "free", "free"]


class TestRate:
    def test_starts_never_exceed_the_burst_then_the_rate(self, s: Store, clock: FakeClock) -> None:
        limited(s, LimitSpec.declare("api", rate="60/m", burst=3))  # one a second
        s.start_runs([{"task": "call"}] * 20)
        assert len(claims(s, 10)) == 3  # the burst
        assert claims(s, 10) == []
        clock.advance(1.0)
        assert len(claims(s, 10)) == 1
        clock.advance(2.5)
        assert len(claims(s, 10)) == 2  # 2.5 tokens: two whole starts
        clock.advance(100)
        assert len(claims(s, 10)) == 3  # never more than the burst after a quiet spell
        assert s.next_ready_at() is not None

    def test_a_hand_back_gives_its_start_back(self, s: Store, clock: FakeClock) -> None:
        limited(s, LimitSpec.declare("api", rate="1/m", burst=1))
        s.start_runs([{"task": "call"}] * 2)
        (lease,) = claims(s, 5)
        assert claims(s, 5) == []
        s.commit_many([Commit(lease, "handback")])  # never started: it did not call the API
        assert len(claims(s, 5)) == 1


class TestTokens:
    def test_the_commit_settles_what_the_handler_used(self, s: Store, clock: FakeClock) -> None:
        limited(s, LimitSpec.declare("llm", tokens="1000/m", token_burst=1000), tokens=400)
        s.start_runs([{"task": "call"}] * 10)
        a, b = claims(s, 10)  # 400 + 400 reserved of 1000: a third would not fit
        assert (a.reserved, b.reserved, a.gates) == (400, 400, ("llm",))
        done(s, a, used_tokens=50)  # 350 come back
        assert len(claims(s, 10)) == 1  # 1000 - 50 - 400 = 550 left: one more, not two
        (info,) = s.limits()
        assert info.used_tokens == 50 and info.in_use == 2

    def test_a_zombies_commit_settles_nothing_and_a_takeover_gives_back_its_reservation(
        self, s: Store, clock: FakeClock
    ) -> None:
        limited(s, LimitSpec.declare("llm", tokens="600/m", token_burst=600), tokens=500)
        s.start_runs([{"task": "call"}] * 2)
        (zombie,) = claims(s, 5, "z")
        clock.advance(TTL)  # it paused past its lease: its reservation comes back at takeover
        (taken,) = claims(s, 5, "w")
        assert taken.run_id == zombie.run_id
        out = s.commit_many([Commit(zombie, "finish", expected_revision=0, new_state={},
                                    used_tokens=1)])  # fmt: skip
        assert out.results[0].value == "lease_lost"
        (info,) = s.limits()
        assert info.used_tokens == 0  # the refused commit charged nothing
        done(s, taken, used_tokens=100)
        assert s.limits()[0].used_tokens == 100


class TestRetryAfter:
    def test_it_spends_no_attempt_and_pauses_the_limit_for_everyone(
        self, s: Store, clock: FakeClock
    ) -> None:
        limited(s, LimitSpec.declare("api", concurrency=5))
        s.start_runs([{"task": "call"}] * 3)
        first, *_ = claims(s, 1)
        out = s.commit_many([Commit(first, "retry_after", delay=10.0, error="429")])
        assert out.results[0].value == "ok"
        assert claims(s, 5) == []  # paused for every worker
        clock.advance(10.0)
        again = claims(s, 5)
        assert len(again) == 3
        retried = next(lease for lease in again if lease.run_id == first.run_id)
        assert (retried.attempt, retried.tries) == (2, 1)  # a new token, no attempt spent

    def test_without_the_pause_only_the_task_waits(self, s: Store, clock: FakeClock) -> None:
        limited(s, LimitSpec.declare("api", concurrency=5))
        s.start_runs([{"task": "call"}] * 3)
        (first,) = claims(s, 1)
        s.commit_many([Commit(first, "retry_after", delay=10.0, pause=False)])
        assert len(claims(s, 5)) == 2  # the others go on


class TestFairness:
    def test_ten_runs_of_b_start_at_once_behind_ten_thousand_of_a(self, s: Store) -> None:
        limited(s, LimitSpec.declare("per-tenant", concurrency=3, per="tenant"))
        s.start_runs([{"task": "call", "payload": {"tenant": "A"}}] * 10_000)
        s.start_runs([{"task": "call", "payload": {"tenant": "B"}}] * 10)
        got = claims(s, 16)
        assert keys(got).count("B") == 3 and keys(got).count("A") == 3  # the caps, in turn
        for lease in got:  # B's next run goes as soon as one of B's slots frees
            if lease.payload["tenant"] == "B":
                done(s, lease)
                assert keys(claims(s, 1)) == ["B"]

    def test_a_batched_claim_takes_one_run_of_each_key_in_one_statement(
        self, s: Store, backend: Backend
    ) -> None:
        limited(s, LimitSpec.declare("per-tenant", concurrency=1, per="tenant"))
        s.start_runs([{"task": "call", "payload": {"tenant": f"t{i % 40}"}} for i in range(80)])
        seen: list[str] = []
        original, original_look = Tx.rows, Tx.look_gates
        together: list[bool] = []  # inside look_gates (its statements are counted there)

        def rows(tx: Tx, name: str, params: Params) -> list[Row]:
            if not together:
                seen.append(name)
            return original(tx, name, params)

        def look_gates(
            tx: Tx, gates: Sequence[str], lines: Sequence[str] = (), *args: Any
        ) -> GateLook:
            seen.extend(["GATE_STATE"] * bool(gates) + ["LINE_RUNS"] * bool(lines))
            together.append(True)
            try:
                return original_look(tx, gates, lines, *args)
            finally:
                together.pop()

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Tx, "rows", rows)
            mp.setattr(Tx, "look_gates", look_gates)
            got = claims(s, 16)
        assert len(got) == 16 and len(set(keys(got))) == 16  # one run of each of 16 keys
        # the lines are asked together: one read of their gates, of their runs, one claim
        # (PostgreSQL: the reads go in OPEN_GATES' round trip, OPEN_MARKED, when the
        # transaction settled no gate)
        looks = 0 if backend.name == "postgres" else 1
        assert [seen.count(n) for n in ("GATE_STATE", "LINE_RUNS", "CLAIM_RUNS")] == [
            looks, looks, 1]  # fmt: skip
        assert len(claims(s, 40)) == 24  # the other keys' first runs; the 16 keys are full

    def test_keys_with_quotes_and_percent_signs_are_gates_like_any(self, s: Store) -> None:
        # a claim's gate writes travel as literals in the COMMIT's query on PostgreSQL
        limited(s, LimitSpec.declare("per-tenant", concurrency=1, per="tenant"))
        odd = ["50%'s", "a\\b", "%(now)s", 'q"uote']
        s.start_runs([{"task": "call", "payload": {"tenant": k}} for k in odd * 2])
        first = claims(s, 10)
        assert sorted(keys(first)) == sorted(odd) and claims(s, 10) == []  # one each: full
        for lease in first:
            done(s, lease)
        assert sorted(keys(claims(s, 10))) == sorted(odd)


class TestDeclarations:
    def test_an_operators_numbers_win_until_a_release_declares_others(self, s: Store) -> None:
        limited(s, LimitSpec.declare("api", concurrency=1))
        s.start_runs([{"task": "call"}] * 5)
        assert len(claims(s, 5)) == 1
        s.set_limit("api", concurrency=3)
        assert len(claims(s, 5)) == 2  # every worker obeys the new number at once
        (info,) = s.limits()
        assert (info.spec.concurrency, info.overrides) == (3, {"concurrency": 3})
        assert s.declare_limits({"api": LimitSpec.declare("api", concurrency=1)}, "here") == []
        assert s.limits()[0].spec.concurrency == 3  # the same declaration: the operator's stays
        told = s.declare_limits({"api": LimitSpec.declare("api", concurrency=2)}, "there")
        assert told and "here had declared {'concurrency': 1}" in told[0]
        assert (s.limits()[0].spec.concurrency, s.limits()[0].overrides) == (2, None)

    def test_setting_an_unknown_limit_or_a_bad_number_is_refused(self, s: Store) -> None:
        limited(s, LimitSpec.declare("api", concurrency=1))
        with pytest.raises(Exception, match="no limit 'nope'"):
            s.set_limit("nope", concurrency=2)
        with pytest.raises(Exception, match="concurrency must be"):
            s.set_limit("api", concurrency=-2)


class TestTwoLimits:
    def test_a_full_global_cap_keeps_every_line_closed_until_a_slot_frees(self, s: Store) -> None:
        limited(s, LimitSpec.declare("openai", concurrency=2),
                LimitSpec.declare("per-tenant", concurrency=5, per="tenant"))  # fmt: skip
        s.start_runs([{"task": "call", "payload": {"tenant": t}} for t in "ABCD" for _ in range(3)])
        got = claims(s, 10)
        assert len(got) == 2  # the global cap, whatever the tenants
        assert claims(s, 10) == []
        done(s, got[0])
        assert len(claims(s, 10)) == 1  # the line it blocked reopened with the freed slot


@pytest.mark.parametrize("kind", ["finish", "release", "handback"])
def test_every_kind_of_commit_frees_its_slot(s: Store, kind: str) -> None:
    limited(s, LimitSpec.declare("cap", concurrency=1))
    s.start_runs([{"task": "call"}] * 2)
    (lease,) = claims(s, 5)
    commit = Commit(lease, kind, expected_revision=0, new_state={})  # type: ignore[arg-type]
    assert s.commit_many([commit], claim=ClaimRequest("w", TTL, 3, 1)).leases  # the next one


def test_a_backend_without_limits_claims_as_before(backend: Backend) -> None:
    s = backend.open()
    s.start_runs([{"task": "t"}] * 3)
    assert len(s.claim("w", TTL, limit=5)) == 3
    assert s.limits() == []
    s.close()


class TestTheRead:
    def test_waiting_counts_every_run_behind_a_limit_also_in_another_gates_line(
        self, s: Store
    ) -> None:
        limited(s, LimitSpec.declare("openai", concurrency=1),
                LimitSpec.declare("per-tenant", concurrency=5, per="tenant"))  # fmt: skip
        s.start_runs([{"task": "call", "payload": {"tenant": t}} for t in "AB" for _ in range(3)])
        assert len(claims(s, 10)) == 1  # the global cap: five wait, in their tenants' lines
        by = {info.name: info for info in s.limits()}
        assert (by["openai"].in_use, by["openai"].waiting) == (1, 5)  # not 0: none is its line
        assert (by["per-tenant"].in_use, by["per-tenant"].waiting) == (1, 5)
        assert {k.key: k.waiting for k in by["per-tenant"].keys} in (
            {"A": 2, "B": 3},
            {"A": 3, "B": 2},
        )
        (only,) = by["openai"].keys
        assert (only.key, only.live, only.waiting) == ("", 1, 5)

    def test_it_shows_the_buckets_now(self, s: Store, clock: FakeClock) -> None:
        limited(s, LimitSpec.declare("api", rate="60/m", burst=3,
                                     tokens="600/m", token_burst=1000), tokens=100)  # fmt: skip
        (fresh,) = s.limits()
        assert (fresh.level, fresh.tokens_left) == (3, 1000)  # full before any use
        s.start_runs([{"task": "call"}] * 5)
        assert len(claims(s, 2)) == 2
        (info,) = s.limits()
        assert info.level == pytest.approx(1) and info.tokens_left == pytest.approx(800)
        clock.advance(1.0)
        (later,) = s.limits()
        assert later.level == pytest.approx(2) and later.tokens_left == pytest.approx(810)

    def test_lifting_a_rate_lifts_its_burst(self, s: Store) -> None:
        limited(s, LimitSpec.declare("api", rate="1/m", burst=1, concurrency=2))
        spec = s.set_limit("api", rate=0)
        assert (spec.rate, spec.burst, spec.concurrency) == (None, None, 2)
        s.start_runs([{"task": "call"}] * 5)
        assert len(claims(s, 5)) == 2  # only the cap now
