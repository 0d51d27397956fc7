"""Receivers that never finish, against real local sockets: a webhook POST
has one deadline over connecting, sending and the whole answer, reads at most 64 KiB of the
answer, and a receiver that floods, trickles (its head or its body), hangs or redirects is a
failure with its reason: counted (``supervisor webhooks``), backed off, then a dead letter.
A graceful stop and ``webhooks remove`` free the delivery within one POST deadline."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import FakeClock
from hostile_receivers import HostileReceiver
from store_backends import Backend
from sv_harness import Supervisor
from webhook_receiver import Receiver

from supervisor.commands.cli import cli
from workerproc.context import TaskContext as Context
from workerproc.delivery import Deliverer
from workerproc.posting import MAX_ANSWER
from workerproc.store import CasResult, Store, open_store
from workerproc.store.webhooks import WEBHOOK_QUEUE, RetryNumbers

SECRET = "hostile-secret"
LIMIT = 1.0  # each POST's deadline here
SLACK = 1.5  # what a loaded 2-core machine may add to it

REASONS = {
    "flood": f"HTTP 200 with an answer longer than {MAX_ANSWER} bytes (not read further)",
    "trickle_head": f"no complete answer within {LIMIT:g} s",
    "trickle_body": f"no complete answer within {LIMIT:g} s",
    "hang": f"no complete answer within {LIMIT:g} s",
    "redirect": "HTTP 307: redirects are not followed",
    "tls_trickle": f"no complete answer within {LIMIT:g} s",
}


@pytest.fixture
def honest() -> Iterator[Receiver]:
    r = Receiver(SECRET)
    yield r
    r.down()


def execute(s: Store) -> float:
    """Claim the delivery, run one execution to its end, commit it; the seconds it took."""
    (lease,) = s.claim("w", 30.0, limit=1, queues=[WEBHOOK_QUEUE])
    ctx = Context(lease, threading.Event())
    began = time.monotonic()
    Deliverer(lambda: s).deliver(ctx, s)
    took = time.monotonic() - began
    assert ctx.commit is not None
    assert s.commit_many([ctx.commit]).results == (CasResult.OK,)
    return took


@pytest.mark.parametrize("behaviour", sorted(REASONS))
def test_a_hostile_receiver_is_a_failure_with_its_reason_backed_off_then_dead_lettered(
    s: Store, backend: Backend, clock: FakeClock, honest: Receiver, behaviour: str
) -> None:
    hostile = HostileReceiver(behaviour, location=honest.url)
    try:
        retry = RetryNumbers(max_failures=2, backoff=30.0, backoff_max=30.0, timeout=LIMIT)
        s.add_webhook("h", hostile.url, secret=SECRET, kinds=["run.enqueued"], retry=retry)
        s.start_run("noop")
        took = execute(s)
        # before: a trickle held the POST for its whole answer (20 s of head, 300 s of body:
        # a socket timeout bounds each read, not the POST), a flood grew the worker for ever
        assert took < LIMIT + SLACK, f"{behaviour}: the execution took {took:.1f} s"
        assert hostile.requests == 1
        (info,) = s.webhooks()
        assert info.failures == 1 and info.delivered == 0
        assert info.last_error is not None and REASONS[behaviour] in info.last_error
        assert info.next_try_at is not None and info.next_try_at - s.now() > 20.0  # backed off
        shown = CliRunner().invoke(cli, ["webhooks", "--db", backend.url, "--json"])
        (doc,) = json.loads(shown.output)
        assert doc["failures"] == 1 and REASONS[behaviour] in doc["last_error"]
        clock.advance(40.0)  # its next try is due
        assert execute(s) < LIMIT + SLACK
        (info,) = s.webhooks()
        (letter,) = info.dead
        assert REASONS[behaviour] in letter.error and info.dead_total == 1
        assert hostile.requests == 2
        assert honest.all() == [], "a redirect is never followed"
    finally:
        hostile.close()


def test_a_receiver_that_answers_within_the_limits_is_a_delivery(s: Store) -> None:
    """A 2xx whose body is exactly 64 KiB, sent at once: delivered (the bound is not a
    failure of its own)."""
    hostile = HostileReceiver("trickle_body", pace=0.0)  # 1,000 bytes, no pause
    try:
        s.add_webhook("h", hostile.url, secret=SECRET, kinds=["run.enqueued"],
                      retry=RetryNumbers(timeout=5.0))  # fmt: skip
        s.start_run("noop")
        execute(s)
        (info,) = s.webhooks()
        assert (info.delivered, info.failures, info.last_error) == (1, 0, None)
    finally:
        hostile.close()


# -- a real worker: a stop, a removal --------------------------------------------------------------
def _pool(tmp_path: Path, url: str, receiver: HostileReceiver, timeout: float) -> Supervisor:
    with open_store(url) as store:
        store.add_webhook("slow", receiver.url, secret=SECRET, kinds=["run.enqueued"],
                          retry=RetryNumbers(timeout=timeout))  # fmt: skip
        store.start_run("noop")
    sv = Supervisor(tmp_path)
    sv.db = url
    sv.start("--poll-interval", "0.2", app="apps.sv_app:app", n=1)
    receiver.wait_busy()
    return sv


@pytest.mark.slow
def test_a_graceful_stop_waits_for_one_post_deadline_at_most(tmp_path: Path) -> None:
    """A receiver trickling its answer for 20 s: the stop waited its graceful timeout and
    SIGKILLed the worker (docs: at most 1 s plus one POST timeout)."""
    receiver = HostileReceiver("trickle_head", pace=0.5)
    timeout = 3.0
    try:
        sv = _pool(tmp_path, str(tmp_path / "lk.db"), receiver, timeout)
        try:
            stopped = time.monotonic()
            sv.signal(signal.SIGTERM)
            code = sv.wait_exit(timeout + 1.0 + 10.0)
            took = time.monotonic() - stopped
        finally:
            sv.kill_all()
        assert code == 0, sv.text()[-3000:]
        assert took < timeout + 1.0 + SLACK + 2.0, f"the stop took {took:.1f} s"
        assert not sv.events("drain_timeout") and "SIGKILL" not in sv.text()
    finally:
        receiver.close()


@pytest.mark.slow
def test_webhooks_remove_frees_the_delivery_within_one_post_deadline(tmp_path: Path) -> None:
    receiver = HostileReceiver("trickle_body", pace=0.5)
    timeout = 3.0
    url = str(tmp_path / "lk.db")
    try:
        sv = _pool(tmp_path, url, receiver, timeout)
        try:
            removed = time.monotonic()
            result = CliRunner().invoke(cli, ["webhooks", "remove", "slow", "--db", url])
            assert result.exit_code == 0, result.output
            with open_store(url) as store:
                while store.stats().queues[WEBHOOK_QUEUE].leased:
                    assert time.monotonic() - removed < timeout + SLACK + 2.0, "still leased"
                    time.sleep(0.05)
            freed = time.monotonic() - removed
        finally:
            sv.kill_all()
        assert freed < timeout + SLACK, f"freed after {freed:.1f} s"
        assert receiver.requests == 1, "nothing more is sent to a removed webhook"
    finally:
        receiver.close()
