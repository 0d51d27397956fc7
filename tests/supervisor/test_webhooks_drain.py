"""On both backends: ``supervisor start --drain`` ends only once no task is
ready, delayed or leased AND every webhook has delivered what it can: caught up, or backing off
after a failure, which its last line then names (the webhook, its backlog, its next try). A real
supervisor, a real receiver, a real database."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from sv_harness import Supervisor
from webhook_receiver import Receiver

from supervisor.commands.cli import cli
from supervisor.loop.report import _behind
from workerproc.store import open_store
from workerproc.store.webhooks import RetryNumbers, WebhookInfo

pytestmark = pytest.mark.slow

SECRET = "drain-secret"
APP = "apps.sv_app:app"


@pytest.fixture
def url(db: str) -> str:
    """The conftest's database, each backend in turn."""
    return db


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(SECRET)
    yield r
    r.down()


@pytest.fixture
def silent() -> Iterator[str]:
    """A receiver that takes every connection and never answers: each POST times out."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def take() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:  # (closed: the test is over)
                return

    threading.Thread(target=take, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/hook"
    server.close()
    for conn in held:
        conn.close()


def supervisor(tmp_path: Path, url: str) -> Supervisor:
    sv = Supervisor(tmp_path)
    sv.db = url
    return sv


def drain(sv: Supervisor, timeout: float = 120.0) -> str:
    """Run ``start --drain`` to its end; its last log line."""
    try:
        sv.start("--drain", "--poll-interval", "0.2", app=APP, n=2)
        code = sv.wait_exit(timeout)
    finally:
        sv.kill_all()
    assert code == 0, sv.text()[-3000:]
    (last,) = sv.events("drain_finished")
    return str(last["msg"])


def test_a_webhook_added_after_the_work_delivers_its_backlog_before_the_drain_ends(
    tmp_path: Path, url: str, receiver: Receiver
) -> None:
    """``webhooks add q2 URL --after 0`` with 300 events waiting, then a drain: it
    exited at once, with no POST made."""
    with open_store(url) as store:
        runs = store.start_runs([{"task": "noop"}] * 150)
        assert all(store.cancel_run(r) for r in runs)  # (no work left: only events to deliver)
        secret = tmp_path / "secret"
        secret.write_text(SECRET)
        secret.chmod(0o600)
        clean = {k: None for k in os.environ if k.startswith("SUPERVISOR_")}
        added = CliRunner().invoke(cli, ["webhooks", "add", "q2", receiver.url, "--db", url,
                                         "--after", "0", "--secret-file", str(secret)],
                                   env=clean)  # type: ignore[arg-type]  # fmt: skip
        assert added.exit_code == 0, added.output
        waiting = [e.id for e in store.events(limit=10_000) if e.run_id in runs]
    assert len(waiting) == 300
    drain(supervisor(tmp_path, url))
    got = [d.event["id"] for d in receiver.all() if d.accepted]
    assert sorted(set(got)) == waiting, f"{len(set(got))} of {len(waiting)} delivered"
    with open_store(url) as store:
        (info,) = store.webhooks()
        assert info.backlog == 0 and info.cursor >= waiting[-1]


def test_a_drain_ends_with_every_event_of_its_work_delivered(
    tmp_path: Path, url: str, receiver: Receiver
) -> None:
    """On PostgreSQL 123 of 1,186 run.succeeded events were not delivered when the
    drain ended (the delivery was parked, its waker not yet round)."""
    with open_store(url) as store:
        store.add_webhook("done", receiver.url, secret=SECRET, kinds=["run.succeeded"])
        runs = store.start_runs([{"task": "noop"}] * 100)
        # the last run ends after the delivery has caught up and parked: its waker must wake it
        runs.append(store.start_run("sleep", {"s": 1.5}))
    drain(supervisor(tmp_path, url))
    got = {d.event["run_id"] for d in receiver.all() if d.accepted}
    assert got == set(runs), f"{len(set(runs) - got)} of {len(runs)} not delivered"


def test_a_drain_does_not_wait_for_a_webhook_backing_off_and_its_last_line_names_it(
    tmp_path: Path, url: str, receiver: Receiver
) -> None:
    receiver.down()  # connections refused: every try fails, and the next one is 60 s away
    retry = RetryNumbers(max_failures=1000, backoff=60.0, backoff_max=60.0, timeout=2.0)
    with open_store(url) as store:
        store.add_webhook("down", receiver.url, secret=SECRET, kinds=["run.succeeded"],
                          retry=retry)  # fmt: skip
        store.add_webhook("gone", receiver.url, secret=SECRET, kinds=["run.failed"])
        store.start_runs([{"task": "noop"}] * 5)
    last = drain(supervisor(tmp_path, url), timeout=50.0)  # well before the next try
    found = re.search(r"webhook down behind by (\d+) events?, next try in (\d+) s", last)
    assert found is not None, last
    assert int(found[1]) == 5 and 30 <= int(found[2]) <= 75, last
    assert "gone" not in last, "a webhook caught up is not named"
    with open_store(url) as store:
        info = {i.name: i for i in store.webhooks()}
        assert info["down"].failures >= 1 and info["down"].backlog == 5
        assert info["down"].next_try_at is not None
        assert info["gone"].backlog == 0


def test_a_drain_names_a_webhook_whose_delivery_run_is_cancelled_and_how_to_resume_it(
    tmp_path: Path, url: str
) -> None:
    with open_store(url) as store:
        hook = store.add_webhook("cx", "http://127.0.0.1:9/", secret=SECRET,
                                 kinds=["run.succeeded"])  # fmt: skip
        assert store.cancel_run(hook.run_id)
        store.start_runs([{"task": "noop"}] * 5)
    last = drain(supervisor(tmp_path, url))
    assert last.endswith(
        f"; webhook cx behind by 5 events, its delivery run cancelled "
        f"(supervisor retry {hook.run_id})"
    ), last


@pytest.mark.parametrize(
    ("status", "advice"),
    [
        ("missing", "its delivery run is gone: supervisor webhooks remove cx, then add it "
                    "again with --after 41"),
        ("cancelled", "its delivery run cancelled (supervisor retry 7)"),
        ("failed", "its delivery run failed (supervisor retry 7)"),
    ],
)  # fmt: skip
def test_the_drains_advice_fits_the_delivery_runs_state(status: str, advice: str) -> None:
    """A run that is gone cannot be retried (a database pruned before prune kept them)."""
    hook = WebhookInfo("cx", "http://127.0.0.1:9/", None, 7, 0.0, RetryNumbers(), status, 41,
                       0, 0, None, None, 0, (), backlog=3)  # fmt: skip
    assert _behind(hook, 100.0) == f"webhook cx behind by 3 events, {advice}"


def test_a_drain_does_not_wait_out_a_receiver_that_never_answers(
    tmp_path: Path, url: str, silent: str
) -> None:
    """``backoff=backoff_max=0`` (allowed) and a receiver that never answers: the delivery is
    always trying again (in flight, or due now), never "backing off" with its next try ahead,
    so the drain waited ``max_failures`` timeouts per event (here 5 x 20 x 1 s; hours with the
    default numbers). A webhook with a failure committed has delivered what it can for now."""
    retry = RetryNumbers(max_failures=20, backoff=0.0, backoff_max=0.0, timeout=1.0)
    with open_store(url) as store:
        store.add_webhook("silent", silent, secret=SECRET, kinds=["run.succeeded"],
                          retry=retry)  # fmt: skip
        store.start_runs([{"task": "noop"}] * 5)
    began = time.monotonic()
    last = drain(supervisor(tmp_path, url), timeout=45.0)
    assert time.monotonic() - began < 45.0
    found = re.search(r"webhook silent behind by 5 events, next try (now|in \d+ s) "
                      r"\((\d+) failures? in a row\)$", last)  # fmt: skip
    assert found is not None, last
    with open_store(url) as store:
        (info,) = store.webhooks()
        assert info.backlog == 5 and info.dead_total == 0
