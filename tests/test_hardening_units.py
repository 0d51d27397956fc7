"""Issue 11 without a running pool: zombies are dead owners, a clean exit that still held a lease
is a crash, the database file's identity, the stall watch, and corruption seen by the loop."""

from __future__ import annotations

import signal
import subprocess
import sys

import psutil
from helpers import wait_for

from workerproc.identity import make_owner, owner_is_dead


# -- item 4: a zombie is dead ------------------------------------------------------------------
def test_a_zombie_owner_is_dead() -> None:
    """A SIGKILLed process that nobody reaped yet (its parent was killed too, and PID 1 has not
    come round) still has a start time; its leases must be released all the same."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owner = make_owner(pid=child.pid)
        assert not owner_is_dead(owner)
        child.send_signal(signal.SIGKILL)
        # Popen reaps only in wait()/poll(): until then the child is a zombie
        wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE,
                 what="the child to become a zombie")  # fmt: skip
        assert owner_is_dead(owner)
    finally:
        child.kill()
        child.wait()
    assert owner_is_dead(owner)  # reaped: gone for good
