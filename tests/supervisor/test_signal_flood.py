"""No signal that asks for an action is ever dropped: a flood of SIGCHLD (real child exits in
this process, real signals to a real supervisor) around a TERM and TTINs loses none of them."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sv_harness import SUPPORT, Supervisor

from supervisor.loop.signals import SignalInbox

FLOOD = 300  # well past any small bound a queue might have


@pytest.fixture
def inbox() -> Iterator[SignalInbox]:
    box = SignalInbox()
    box.install()
    try:
        yield box
    finally:
        box.uninstall()
        box.close()


def flood_of_child_exits(count: int) -> None:
    """``count`` children that exit at once, each reaped before the next starts: one SIGCHLD
    each, delivered to this process while it waits in ``waitpid``."""
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)


@pytest.mark.e2e  # over ten seconds: scripts/test-e2e
def test_a_sigchld_flood_around_term_and_ttin_loses_none_of_them(inbox: SignalInbox) -> None:
    flood_of_child_exits(FLOOD)
    os.kill(os.getpid(), signal.SIGTTIN)  # a signal to oneself is handled before kill returns
    flood_of_child_exits(FLOOD)
    os.kill(os.getpid(), signal.SIGTERM)
    flood_of_child_exits(FLOOD)
    for _ in range(2):
        os.kill(os.getpid(), signal.SIGTTIN)
        flood_of_child_exits(FLOOD // 3)
    assert inbox.child_exited  # the flood was seen...
    actions = inbox.pop_all()  # ...and pushed nothing out: three TTINs are three
    assert actions == [signal.SIGTTIN, signal.SIGTERM, signal.SIGTTIN, signal.SIGTTIN]
    assert not inbox.child_exited and inbox.pop_all() == []


def test_sigchld_alone_wakes_the_loop_without_queueing(inbox: SignalInbox) -> None:
    flood_of_child_exits(FLOOD)
    started = time.monotonic()
    inbox.wait(30.0)  # returns at once: a reap is wanted
    assert time.monotonic() - started < 10.0
    assert inbox.queue == [] and inbox.pop_all() == []
    assert not inbox.child_exited


@pytest.mark.slow
def test_a_wedged_supervisor_acts_on_term_after_a_sigchld_flood(
    sv: Supervisor, tmp_path: Path
) -> None:
    """While its loop is blocked the supervisor records a TERM, two TTINs and hundreds of
    SIGCHLDs; once the loop runs again it acts on all three action signals, in order."""
    wedge = tmp_path / "wedge"
    sv.command = [sys.executable, str(SUPPORT / "wedged_supervisor.py"), str(wedge)]
    sv.start(n=1)
    sv.wait_event("ready")
    wedge.touch()
    sv.wait_event("test_wedged")
    order = [signal.SIGTTIN, signal.SIGTERM, signal.SIGTTIN]
    for signum in order:
        sv.signal(signum)
        for _ in range(FLOOD):
            sv.signal(signal.SIGCHLD)
            time.sleep(0.001)  # pacing, not waiting: most arrive one by one, not merged
    wedge.unlink()
    assert sv.wait_exit(60) == 0
    seen = [e["signal"] for e in sv.events("signal")]
    assert seen == [s.name for s in order]
