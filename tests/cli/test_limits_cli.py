"""``supervisor limits`` and ``supervisor limits set`` against a real database, on
both backends: each limit with its numbers, its use now and the runs waiting behind it, its
busiest keys; numbers changed at run time for every claimer until a release declares others;
bad input is one line on stderr and a non-zero exit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import error_line, invoke

from supervisor import exitcodes
from workerproc.store import TaskOptions, open_store
from workerproc.store.limits import LimitSpec

SPECS = {
    "openai": LimitSpec.declare(
        "openai", rate="60/h", burst=5, concurrency=2, tokens="600/h", token_burst=6000
    ),  # slow buckets: the levels hold still
    "per-tenant": LimitSpec.declare("per-tenant", concurrency=3, per="tenant"),
}


@pytest.fixture
def db(db: str) -> str:
    """A database whose task ``call`` waits behind two limits, three of its runs waiting."""
    url = db
    with open_store(url) as s:
        s.register_tasks({"call": TaskOptions(limits=("openai", "per-tenant"), tokens=100)})
        assert s.declare_limits(SPECS, by="host-a") == []
        s.start_runs([{"task": "call", "payload": {"tenant": t}} for t in "AAAB"])
        assert len(s.claim("w", 30.0, limit=10)) == 2  # openai's cap: two run, two wait
    return url


def test_limits_lists_numbers_use_waiting_and_busiest_keys(db: str) -> None:
    result = invoke("limits", "--db", db)
    assert result.exit_code == 0, result.output
    head, openai, tenant = result.stdout.splitlines()[:3]
    assert head.split()[:3] == ["LIMIT", "PER", "RATE"]
    assert openai.split()[:8] == ["openai", "-", "1/m", "5.0", "2", "10/m", "2", "2"]
    assert tenant.split()[:7] == ["per-tenant", "tenant", "-", "-", "3", "-", "2"]
    assert "busiest keys of per-tenant" in result.stdout
    data = {d["name"]: d for d in json.loads(invoke("limits", "--db", db, "--json").stdout)}
    assert (data["openai"]["in_use"], data["openai"]["waiting"]) == (2, 2)
    assert data["openai"]["tokens_left"] == pytest.approx(6000 - 200, abs=2)
    assert data["openai"]["level"] == pytest.approx(3, abs=0.1)
    keys = {k["key"]: (k["live"], k["waiting"]) for k in data["per-tenant"]["keys"]}
    assert sum(w for _, w in keys.values()) == 2 and sum(u for u, _ in keys.values()) == 2
    assert data["per-tenant"]["declared_by"] == "host-a" and data["per-tenant"]["set"] is None
    one = json.loads(invoke("limits", "--db", db, "--json", "--keys", "1").stdout)
    assert [len(d["keys"]) for d in one] == [1, 1]


def test_limits_set_changes_the_numbers_for_every_claimer(db: str) -> None:
    result = invoke("limits", "set", "openai", "--db", db, "--concurrency", "4", "--rate", "none")
    assert result.exit_code == 0, result.output
    assert "concurrency 4" in result.stdout and "rate" not in result.stdout.split(":")[1]
    with open_store(db) as s:  # another claimer, another process: the new cap applies at once
        assert len(s.claim("w2", 30.0, limit=10)) == 2
        (openai,) = [i for i in s.limits() if i.name == "openai"]
        assert (openai.spec.rate, openai.spec.burst, openai.spec.concurrency) == (None, None, 4)
        assert openai.overrides == {"concurrency": 4, "rate": 0.0}
        # a release declaring other numbers wins again, and says whose it replaced
        told = s.declare_limits({"openai": LimitSpec.declare("openai", concurrency=1)}, "host-b")
        assert len(told) == 1 and "host-a had declared" in told[0]
    data = {d["name"]: d for d in json.loads(invoke("limits", "--db", db, "--json").stdout)}
    assert data["openai"]["concurrency"] == 1 and data["openai"]["set"] is None
    assert data["openai"]["declared_by"] == "host-b"


def test_the_group_takes_db_before_the_subcommand(db: str) -> None:
    result = invoke("limits", "--db", db, "set", "per-tenant", "--concurrency", "7")
    assert result.exit_code == 0, result.output
    with open_store(db) as s:
        assert [i.spec.concurrency for i in s.limits() if i.name == "per-tenant"] == [7]


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["set", "nope", "--rate", "1/s"], exitcodes.ERROR, "no limit 'nope'"),
        (["set", "openai", "--rate", "1/x"], exitcodes.USAGE, "--rate must be a rate"),
        (["set", "openai", "--concurrency", "-3"], exitcodes.USAGE, "--concurrency must be"),
        (["set", "openai", "--concurrency", "2.5"], exitcodes.USAGE, "--concurrency must be"),
        (["set", "openai", "--burst", "1e12"], exitcodes.USAGE, "--burst must be"),
        (["set", "openai"], exitcodes.USAGE, "give at least one of"),
        # lifting a limit's last number is a bad value (exit 2), said plainly
        (
            ["set", "per-tenant", "--concurrency", "0"],
            exitcodes.USAGE,
            "limit 'per-tenant' would limit nothing: lifting concurrency leaves it no rate",
        ),
        (["set", "per-tenant", "--concurrency", "none"], exitcodes.USAGE, "would limit nothing"),
        (["set", "per-tenant", "--burst", "3"], exitcodes.USAGE, "burst needs a rate"),
        (["--keys", "1000"], exitcodes.USAGE, "--keys must be"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(
    db: str, args: list[str], code: int, says: str
) -> None:
    line = error_line(invoke("limits", "--db", db, *args), code)
    assert says in line
    with open_store(db) as s:
        assert {i.name: i.spec for i in s.limits()} == SPECS


def test_a_missing_db_is_one_line(tmp_path: Path) -> None:
    assert "--db" in error_line(invoke("limits", "set", "x", "--rate", "1/s"), exitcodes.USAGE)
    missing = str(tmp_path / "none.db")
    assert "does not exist" in error_line(invoke("limits", "--db", missing), exitcodes.ERROR)


def test_no_limits_says_so(tmp_path: Path) -> None:
    url = str(tmp_path / "empty.db")
    open_store(url).close()
    result = invoke("limits", "--db", url)
    assert result.exit_code == 0 and "no limit is declared" in result.stdout
    assert json.loads(invoke("limits", "--db", url, "--json").stdout) == []
