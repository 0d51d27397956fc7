"""sd_notify and the watchdog: the protocol pieces with fakes, then the real supervisor talking to
a real AF_UNIX datagram socket bound here (as systemd's would be), with NOTIFY_SOCKET and
WATCHDOG_USEC in its environment: READY after the workers are up, periodic WATCHDOG,
RELOADING/READY on HUP, STOPPING on TERM, and silence while the main loop is wedged."""

from __future__ import annotations

import os
import secrets
import signal
import sys
import time
from pathlib import Path

import pytest
from helpers import FakeClock
from notify_fakes import FlakyGate, Listener, fake_arbiter
from sv_harness import SUPPORT, Supervisor

from supervisor.integrations.notify import (
    ENV_SOCKET,
    ENV_WATCHDOG_PID,
    ENV_WATCHDOG_USEC,
    Notifier,
    SystemdNotify,
    socket_address,
    watchdog_interval,
)
from supervisor.integrations.probe import StatsProbe


# -- protocol pieces -----------------------------------------------------------------------
def test_socket_address_kinds() -> None:
    assert socket_address("@abstract/notify") == "\0abstract/notify"
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("vsock:2:1234") is None


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({ENV_WATCHDOG_USEC: "30000000"}, 15.0),
        ({ENV_WATCHDOG_USEC: "400000", ENV_WATCHDOG_PID: "4242"}, 0.2),
        ({ENV_WATCHDOG_USEC: "400000", ENV_WATCHDOG_PID: "1"}, None),  # meant for another pid
        ({ENV_WATCHDOG_USEC: "0"}, None),
        ({ENV_WATCHDOG_USEC: "soon"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    assert watchdog_interval(env, 4242) == expected


def test_notifier_speaks_to_an_abstract_socket_and_survives_a_missing_one() -> None:
    name = f"@leasekeeper-test-{os.getpid()}-{secrets.token_hex(4)}"
    listener = Listener("\0" + name[1:])
    try:
        address = socket_address(name)
        assert address is not None
        assert Notifier(address).send("READY=1", "STATUS=up")
        assert listener.with_key("READY") == [{"READY": "1", "STATUS": "up"}]
    finally:
        listener.close()
    gone = Notifier("\0leasekeeper-nobody-listens-" + secrets.token_hex(4))
    assert gone.send("WATCHDOG=1") is False  # logged, never raised
    assert gone.send("WATCHDOG=1") is False


def test_from_env_takes_the_variables_away_from_the_workers() -> None:
    env = {ENV_SOCKET: "/run/x/notify", ENV_WATCHDOG_USEC: "2000000", ENV_WATCHDOG_PID: ""}
    probe = StatsProbe()
    notify = SystemdNotify.from_env(env, probe)
    assert notify is not None and notify.watchdog_every == 1.0
    assert env == {}  # forked workers must not notify in our name
    assert probe.every == 1.0  # the database is probed at least once per ping
    assert SystemdNotify.from_env({}, StatsProbe()) is None


# -- health decides the watchdog (fake clock, fake database) --------------------------------
class RecordingNotifier(Notifier):
    def __init__(self) -> None:
        super().__init__("\0unused")
        self.messages: list[tuple[str, ...]] = []

    def send(self, *assignments: str) -> bool:
        self.messages.append(assignments)
        return True

    def count(self, line: str) -> int:
        return sum(line in m for m in self.messages)


def test_watchdog_pings_only_while_the_database_answers(clock: FakeClock) -> None:
    gate = FlakyGate()
    arb = fake_arbiter(clock, gate)
    probe = StatsProbe()
    out = RecordingNotifier()
    notify = SystemdNotify(out, probe, watchdog_every=1.0, db_stale_after=3.0)
    notify.install(arb)
    probe.want_every(1.0)

    def run_for(seconds: float) -> None:
        for _ in range(int(seconds * 10)):
            probe.step(arb)
            notify.step(arb)
            clock.advance(0.1)

    run_for(3)
    healthy = out.count("WATCHDOG=1")
    assert 3 <= healthy <= 4
    assert any("1 ready" in line for m in out.messages for line in m if line.startswith("STATUS"))
    gate.down = True
    run_for(3)  # the last good read ages out of the 3 s window
    before = out.count("WATCHDOG=1")
    run_for(5)
    assert out.count("WATCHDOG=1") == before  # silent while the database does not answer
    assert notify.withheld and "has not answered" in notify.withheld
    gate.down = False
    run_for(2)
    assert out.count("WATCHDOG=1") > before and notify.withheld is None


def test_lifecycle_events_map_to_notify_messages(clock: FakeClock) -> None:
    arb = fake_arbiter(clock, FlakyGate())
    out = RecordingNotifier()
    SystemdNotify(out, StatsProbe()).install(arb)
    arb.events.emit("ready", reload=False)
    arb.events.emit("reloading", generation=1)
    arb.events.emit("ready", reload=True)
    arb.stop("SIGTERM")
    heads = [m[0] for m in out.messages]
    assert heads == ["READY=1", "RELOADING=1", "READY=1", "STOPPING=1"]
    assert out.messages[0][1] == f"MAINPID={os.getpid()}"
    assert any(f.startswith("MONOTONIC_USEC=") for f in out.messages[1])
    assert all(m[-1].startswith("STATUS=") for m in out.messages)


# -- the real supervisor -------------------------------------------------------------------


@pytest.mark.slow
def test_notify_lifecycle_watchdog_and_wedge(
    sv: Supervisor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listener = Listener(str(tmp_path / "notify.sock"))
    wedge = tmp_path / "wedge"
    monkeypatch.setenv(ENV_SOCKET, str(tmp_path / "notify.sock"))
    monkeypatch.setenv(ENV_WATCHDOG_USEC, "400000")  # WatchdogSec=0.4: a ping every 0.2 s
    sv.command = [sys.executable, str(SUPPORT / "wedged_supervisor.py"), str(wedge)]
    try:
        sv.start(n=2)
        listener.wait("READY")
        (ready,) = listener.with_key("READY")
        assert ready["MAINPID"] == str(sv.pid)
        assert "2/2 workers up" in ready["STATUS"]
        assert sv.events("ready") and len(sv.workers()) == 2  # READY only once all were up

        listener.wait("WATCHDOG", count=3)

        hup = time.monotonic()
        sv.signal(signal.SIGHUP)
        sv.wait_event("reloaded")
        listener.wait("READY", since=hup)
        order = [next(iter(f)) for t, f in listener.poll() if t >= hup and "WATCHDOG" not in f]
        order = [k for k in order if k in ("RELOADING", "READY")]
        assert order == ["RELOADING", "READY"]
        assert listener.with_key("RELOADING")[0]["MONOTONIC_USEC"].isdigit()

        wedge.touch()
        sv.wait_event("test_wedged")
        listener.poll()
        quiet_from = time.monotonic()
        time.sleep(1.2)  # six ping intervals with the loop blocked: proving an absence
        assert listener.with_key("WATCHDOG", since=quiet_from) == []
        wedge.unlink()
        listener.wait("WATCHDOG", since=quiet_from, count=2)  # healthy again: pings resume

        term = time.monotonic()
        sv.signal(signal.SIGTERM)
        assert sv.wait_exit() == 0
        listener.wait("STOPPING", since=term)
        assert "stopping" in listener.with_key("STOPPING")[0]["STATUS"]
    finally:
        listener.close()
