"""The operator's commands for paid calls, on every backend: ``supervisor resolve RUN NAME`` settles
a paid call whose outcome is unknown (its answer, or pay again) and a run parked on it goes on;
``supervisor spend`` sums the tokens and cost kept, per task or payload field, since a time. A
refusal is one line on stderr and an exit code, never a traceback."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cli_runner import error_line, invoke
from helpers import FakeClock

from supervisor import exitcodes
from workerproc.once import call_key
from workerproc.store import CasResult, Commit, Store, open_store
from workerproc.store.calls import parked_on
from workerproc.store.codec import WAIT_FOREVER

TTL = 30.0
REQ = {"model": "m", "prompt": "hello"}


@pytest.fixture
def clock() -> FakeClock:
    """Near the real time: the commands run on the real clock."""
    return FakeClock(time.time())


def parked(store: Store, clock: FakeClock, name: str = "llm") -> int:
    """A run whose first attempt wrote its intent and died in the call; the second attempt,
    with ``unknown="park"``, parked the run on it. Returns the run's id."""
    run = store.start_run("call", {"tenant": "acme"})
    first = store.claim("w1", TTL)
    assert first is not None
    assert store.begin_call(first, call_key(first, name, REQ)).outcome == "call"
    clock.advance(TTL + 1)
    second = store.claim("w2", TTL)
    assert second is not None and second.task_id == first.task_id
    assert store.begin_call(second, call_key(second, name, REQ), unknown="park").outcome == "park"
    park = Commit(second, "park", delay=WAIT_FOREVER, wait_for=parked_on(name),
                  error=f"OutcomeUnknown: {name}")  # fmt: skip
    assert store.commit_many([park]).results == (CasResult.OK,)
    got = store.get_run(run)
    assert got is not None and got.status == "waiting" and got.waiting_for == parked_on(name)
    return run


def test_an_answer_resolves_a_parked_run_and_its_next_attempt_reuses_it(
    db: str, clock: FakeClock
) -> None:
    with open_store(db, clock=clock) as store:
        run = parked(store, clock)
        done = invoke(
            "resolve", str(run), "llm", "--db", db, "--answer", '{"text": "from the log"}'
        )
        assert done.exit_code == 0, done.output
        assert done.stdout.strip() == (f"run {run}: answer kept for call 'llm'; 1 intent without "
                                       "an answer settled; the run goes on now")  # fmt: skip
        got = store.get_run(run)
        assert got is not None and got.status != "waiting" and got.waiting_for is None
        third = store.claim("w3", TTL)
        assert third is not None and third.run_id == run
        start = store.begin_call(third, call_key(third, "llm", REQ), unknown="park")
        assert start.outcome == "reused" and start.kept is not None
        assert start.kept.result == {"text": "from the log"}
        again = invoke("resolve", str(run), "llm", "--db", db, "--answer", '"another"')
        assert again.exit_code == 0, again.output
        assert "an answer was kept already for call 'llm'" in again.stdout
        assert "the run was not parked on this call" in again.stdout
    shown = invoke("show", str(run), "--db", db)
    (line,) = [x for x in shown.stdout.splitlines() if x.split()[1:2] == ["llm"]]
    assert "paid once" in line and "reused 1x" in line and "no answer kept" not in line


def test_pay_again_lets_the_next_attempt_call_once_more(db: str, clock: FakeClock) -> None:
    with open_store(db, clock=clock) as store:
        run = parked(store, clock)
        done = invoke("resolve", str(run), "llm", "--db", db, "--pay-again")
        assert done.exit_code == 0, done.output
        assert done.stdout.strip() == (f"run {run}: call 'llm' is paid again by its next "
                                       "attempt; 1 intent without an answer settled; the run "
                                       "goes on now")  # fmt: skip
        third = store.claim("w3", TTL)
        assert third is not None and third.run_id == run
        start = store.begin_call(third, call_key(third, "llm", REQ), unknown="park")
        assert start.outcome == "call" and start.again
        store.keep_call(third, call_key(third, "llm", REQ), {"text": "paid again"}, 7,
                        intent=start.intent)  # fmt: skip
        assert store.paid_call_totals().paid_again == 1
    shown = invoke("show", str(run), "--db", db)
    lines = shown.stdout.splitlines()
    header = lines[lines.index("paid calls:") + 1].split()
    assert header[:6] == ["TASK", "CALL", "REQUEST", "MADE", "PAID", "AGAIN"], header
    (line,) = [x for x in lines if x.split()[1:2] == ["llm"]]
    cells = line.split()
    assert cells[3:7] == ["2", "1", "1", "3"], line  # made, paid again, unknown, paid by
    assert "paid 2x, 1 unknown" in line


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        ((), exitcodes.USAGE, "give --answer JSON or --pay-again, one of the two"),
        (("--answer", "1", "--pay-again"), exitcodes.USAGE, "one of the two"),
        (("--answer", "{nope"), exitcodes.USAGE, "--answer is not valid JSON"),
        (("--answer", "NaN"), exitcodes.USAGE, "--answer"),
    ],
)
def test_resolve_takes_one_valid_word(
    db: str, clock: FakeClock, args: tuple[str, ...], code: int, words: str
) -> None:
    with open_store(db, clock=clock) as store:
        run = parked(store, clock)
        line = error_line(invoke("resolve", str(run), "llm", "--db", db, *args), code)
        assert words in line, line
        got = store.get_run(run)
        assert got is not None and got.status == "waiting"  # nothing was done


def test_resolve_names_what_is_wrong_in_one_line(db: str, clock: FakeClock) -> None:
    with open_store(db, clock=clock) as store:
        run = parked(store, clock)
        fresh = store.start_run("call")
        cases = [
            (("999999", "llm"), "no run with id 999999"),
            ((str(run), "other"), f"run {run} has made no call named 'other'"),
            ((str(fresh), "llm"), f"run {fresh} has made no call named 'llm'"),
        ]
        for args, words in cases:
            line = error_line(invoke("resolve", *args, "--db", db, "--pay-again"), exitcodes.ERROR)
            assert words in line, line
        assert store.cancel_run(run)
    line = error_line(invoke("resolve", str(run), "llm", "--db", db, "--answer", "1"),
                      exitcodes.ERROR)  # fmt: skip
    assert f"run {run} was cancelled: a run that is over has no call to resolve" in line


def paid(store: Store, task: str, tenant: str | None, tokens: int, cost: float | None) -> None:
    """A run of ``task`` whose call was paid and kept with its tokens and cost."""
    payload = {} if tenant is None else {"tenant": tenant}
    store.start_run(task, payload)
    lease = store.claim("w", TTL)
    assert lease is not None and lease.task == task
    key = call_key(lease, "llm", REQ)
    start = store.begin_call(lease, key)
    assert start.outcome == "call"
    store.keep_call(lease, key, {"ok": 1}, tokens, cost=cost, intent=start.intent)
    assert store.ack(lease)


def test_spend_sums_tokens_and_cost_by_task_and_payload_field(db: str) -> None:
    clock = FakeClock(time.time() - 7200)  # the first call was paid two hours ago
    with open_store(db, clock=clock) as store:
        paid(store, "call", "acme", 100, 0.5)
        clock.now = time.time()
        paid(store, "call", "acme", 40, 0.25)
        paid(store, "call", "beta", 10, None)
        paid(store, "summarise", None, 1000, 2.0)
    out = invoke("spend", "--db", db)
    assert out.exit_code == 0, out.output
    rows = [line.split() for line in out.stdout.splitlines()]
    assert rows[0] == ["TASK", "ENTRIES", "CALLS", "TOKENS", "COST"]
    assert rows[1:] == [["summarise", "1", "1", "1000", "2"], ["call", "3", "3", "150", "0.75"],
                        ["(total)", "4", "4", "1150", "2.75"]]  # fmt: skip
    tenants = [line.split() for line in invoke("spend", "--db", db, "--by", "tenant", "--since",
                                               "1h").stdout.splitlines()]  # fmt: skip
    assert tenants[0][0] == "TENANT"
    assert sorted(tenants[1:-1]) == [["(none)", "1", "1", "1000", "2"],
                                     ["acme", "1", "1", "40", "0.25"],
                                     ["beta", "1", "1", "10", "-"]]  # fmt: skip
    assert tenants[-1] == ["(total)", "3", "3", "1050", "2.25"]
    doc = json.loads(invoke("spend", "--db", db, "--json", "--since", "3600").stdout)
    assert doc["by"] == "task" and doc["since"] == pytest.approx(time.time() - 3600, abs=60)
    assert {k["key"]: k["tokens"] for k in doc["keys"]} == {"summarise": 1000, "call": 50}
    assert doc["total"]["tokens"] == 1050 and doc["total"]["cost"] == pytest.approx(2.25)
    assert doc["more"] is False
    top = invoke("spend", "--db", db, "--limit", "1")
    assert "summarise" in top.stdout and "(the 1 most spent keys" in top.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--since", "0"), "--since must be between 1s and 3650d"),
        (("--since", "3651d"), "--since must be between 1s and 3650d"),
        (("--since", "a week"), "--since must look like 3600, 90m, 24h, 7d or 2w"),
        (("--by", 'te"nant'), "--by names a payload field"),
        (("--by", ""), "--by must be a string of 1 to"),
        (("--limit", "0"), "--limit must be a number from 1"),
    ],
)
def test_spend_refuses_a_bad_option_in_one_line(
    tmp_path: Path, args: tuple[str, ...], words: str
) -> None:
    db = str(tmp_path / "lk.db")
    open_store(db).close()
    line = error_line(invoke("spend", "--db", db, *args), exitcodes.USAGE)
    assert words in line, line


def test_spend_of_nothing_says_so(tmp_path: Path) -> None:
    db = str(tmp_path / "lk.db")
    open_store(db).close()
    out = invoke("spend", "--db", db, "--since", "7d")
    assert out.exit_code == 0 and out.stdout.startswith("no usage kept"), out.output
