"""The store's plain constants (``types`` re-exports them): what JSON is, the clock, the run
statuses and how a filter reads them, the system's run ids, a fenced write's answers."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

JSON = Any  # a value that survives json.dumps/json.loads unchanged
Clock = Callable[[], float]  # seconds, float: the store's clock (tests inject one)

DEFAULT_QUEUE = "default"

RUN_STATUSES = ("pending", "running", "waiting", "succeeded", "failed", "cancelled")
# how a status filter reads: (the status stored, whether a live lease holds the run or None);
# "running" is stored as "pending" (a live lease says running: no write when a lease ends)
STORED_STATUS: dict[str, tuple[str, bool | None]] = {
    "pending": ("pending", False), "running": ("pending", True), "waiting": ("pending", False),
    "succeeded": ("succeeded", None),
    "failed": ("failed", None), "cancelled": ("cancelled", None),
}  # fmt: skip
# "waiting" is stored as "pending" too: no lease holds it and its wait's deadline is ahead
# (a wait for a signal or for children is a next task that is not due)
WAITING_FILTER: dict[str, bool] = {"pending": False, "waiting": True}
TERMINAL_STATUSES = ("succeeded", "failed", "cancelled")
# The system's own runs (the webhooks' delivery runs, B20) are numbered from here up, apart from
# the users' (1, 2, 3 ...): they never take a user's id, and every list hides them unless asked
# (``system=True``, ``--all``) by one index bound, ``id < SYSTEM_RUNS``. Below 2**53, so a
# browser's JSON keeps such an id exact.
SYSTEM_RUNS = 10**15


class CasResult(enum.StrEnum):
    """The three answers of a fenced write (R5)."""

    OK = "ok"
    CONFLICT = "conflict"  # the run moved: another revision, or it is no longer alive
    LEASE_LOST = "lease_lost"  # owner/attempt no longer match, or the lease expired
