"""``python -m supervisor`` whose main loop can be wedged by a test.

Usage: ``python tests/support/wedged_supervisor.py WEDGE_FILE start ...``. Before the loop runs,
one more step goes at the head of its steps: while ``WEDGE_FILE`` exists that step blocks (a bounded
wait), as a deadlocked supervisor would, and logs ``test_wedged`` / ``test_unwedged`` around it.
The supervisor itself has no such hook; this test code adds it from outside.
"""

from __future__ import annotations

import os
import sys
import time

from supervisor.commands.cli import main
from supervisor.logs import event
from supervisor.loop.arbiter import Arbiter, Step

WEDGE_LIMIT = 300.0  # give up even if the test never removes the file


def wedge_step(path: str) -> Step:
    def run(arb: Arbiter) -> None:
        if not os.path.exists(path):
            return
        event("test_wedged", f"test: main loop blocked while {path} exists")
        deadline = time.monotonic() + WEDGE_LIMIT
        while os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.02)
        event("test_unwedged", "test: main loop runs again")

    return Step("test_wedge", run)


def wedgeable(path: str) -> None:
    """Every arbiter of this process gets the wedge step at the head of its loop."""
    original = Arbiter.run

    def run(self: Arbiter) -> int:
        self.add_step(wedge_step(path), before=self.steps[0].name if self.steps else None)
        return original(self)

    Arbiter.run = run  # type: ignore[method-assign]


if __name__ == "__main__":
    wedgeable(sys.argv.pop(1))
    main()
