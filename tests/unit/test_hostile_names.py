"""Hostile small values: a name that prints as something else (U+202E
turns ``evil\\u202etxt.exe`` into ``evilexe.txt``; a control character breaks lines) is refused
wherever a user gives one; lifting a limit's last number, a webhook URL with a space in it and
``RetryAfter(True)`` are refused as the bad values they are. On the command line each is one
line on stderr and exit 2, as every other bad value."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import invoke
from click.testing import Result

from supervisor import exitcodes
from workerproc import App, RetryAfter
from workerproc.store import InvalidOption, InvalidPayload, Store, open_store
from workerproc.store.codec import check_name
from workerproc.store.limits import LimitSpec

# bidirectional controls, C0 and C1 controls, DEL, line and paragraph separators
HOSTILE = ["ab\u202ecd", "a\u202ab", "a\u2066b\u2069", "a\u200fb", "a\u061cb", "a\x01b",
           "a\nb", "a\x7fb", "a\x85b", "a\x9bb", "a\u2028b", "a\u2029b"]  # fmt: skip
FINE = ["approval", "réponse", "承認", "a-b.c:d e", "emoji \U0001f600", "zw\u200dj"]


def bad_value(result: Result) -> str:
    """The one line of a bad value: exit 2, no traceback."""
    assert result.exit_code == exitcodes.USAGE, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.mark.parametrize("name", HOSTILE)
def test_every_name_a_user_gives_refuses_what_prints_as_something_else(
    name: str, store: Store
) -> None:
    with pytest.raises(InvalidPayload, match="control characters or bidirectional controls"):
        check_name(name)
    run = store.start_run("t")
    for give in (
        lambda: store.start_run(name),  # a task's name
        lambda: store.signal(run, name),  # a signal's
        lambda: store.forget_call(run, name),  # a call's
    ):
        with pytest.raises(InvalidPayload) as refused:
            give()
        assert "\u202e" not in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(ValueError):
        App().task(name)(lambda ctx: None)  # an app's task


@pytest.mark.parametrize("name", FINE)
def test_names_of_any_script_stay_welcome(name: str, store: Store) -> None:
    assert check_name(name) == name
    run = store.start_run(name)
    assert store.signal(run, name) > 0


@pytest.mark.parametrize("name", ["ab\u202ecd", "a\x01b", "a\u2066b", "a\x9bb"])
@pytest.mark.parametrize("command", ["signal", "enqueue", "forget"])
def test_the_cli_refuses_such_a_name_as_a_bad_value(name: str, command: str, db_path: str) -> None:
    with open_store(db_path) as s:
        s.start_run("t")
    args = {"signal": ["signal", "1", name], "enqueue": ["enqueue", name],
            "forget": ["forget", "1", name]}[command]  # fmt: skip
    line = bad_value(invoke(*args, "--db", db_path))
    assert "control characters or bidirectional controls" in line
    assert "\u202e" not in line and "\u2066" not in line  # shown escaped, never reversed
    with open_store(db_path) as s:
        assert s.run_signals(1) == [] and len(s.list_runs()) == 1


def test_lifting_a_limits_last_number_is_a_bad_value(db_path: str) -> None:
    """0 and none lift a number (docs/how-to/llm-apis.md); a limit must keep one of rate,
    concurrency and tokens, so lifting its last one is refused, said plainly, and changes
    nothing."""
    with open_store(db_path) as s:
        s.declare_limits({"two": LimitSpec.declare("two", concurrency=2)}, "host-a")
    for lift in ("0", "none"):
        line = bad_value(invoke("limits", "set", "two", "--concurrency", lift, "--db", db_path))
        assert "limit 'two' would limit nothing: lifting concurrency" in line
    with open_store(db_path) as s:
        (two,) = s.limits()
        assert two.spec.concurrency == 2 and not two.overrides
        with pytest.raises(InvalidOption, match="would limit nothing"):
            s.set_limit("two", concurrency=0)
        assert s.set_limit("two", concurrency=0, rate=5.0).concurrency is None  # with another
    assert invoke("limits", "set", "two", "--concurrency", "3", "--db", db_path).exit_code == 0


@pytest.mark.parametrize(
    "url", ["http://a b.com/", "http://a\tb.com/", "https://h.test/x y", "http://a%20b.com/"]
)
def test_a_webhook_url_with_a_space_or_no_valid_host_is_refused(url: str, db_path: str) -> None:
    line = bad_value(invoke("webhooks", "add", "w", url, "--db", db_path))
    assert "webhook's URL" in line
    with open_store(db_path) as s:
        assert s.webhooks() == []
        with pytest.raises(InvalidOption):
            s.add_webhook("w", url, secret="s")


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:9/in", "https://[::1]:8443/x", "https://bücher.example/"]
)
def test_webhook_urls_with_valid_hosts_are_taken(url: str, store: Store) -> None:
    assert store.add_webhook("w", url, secret="s").url == url


@pytest.mark.parametrize("seconds", [True, False])
def test_retry_after_takes_no_bool(seconds: bool) -> None:
    with pytest.raises(ValueError, match="RetryAfter takes 0 to"):
        RetryAfter(seconds)
    assert RetryAfter(1).seconds == 1.0 and RetryAfter(0.5, limit=False).seconds == 0.5


def test_a_run_inline_retry_after_true_fails_the_handler(tmp_path: Path) -> None:
    """The handler's own mistake surfaces as one: the task is not silently retried in 1 s."""
    app = App()

    @app.task()
    def call(ctx: object) -> None:
        raise RetryAfter(True)  # type: ignore[arg-type]

    with pytest.raises(ValueError, match="RetryAfter takes"):
        app.run_inline("call", {})
