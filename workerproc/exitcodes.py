"""Exit codes of a worker process, read by its parent (the supervisor, or a shell)."""

from __future__ import annotations

OK = 0  # stopped on request (graceful drain finished)
BOOT_FAILURE = 3  # cannot even boot (store unreachable, app unusable): do not respawn, stop
TASK_TIMEOUT = 70  # a handler outlived task_timeout; its lease is left to expire: replace me
HEARTBEAT_DIED = 71  # the heartbeat thread died; without it leases would silently lapse
PARENT_DIED = 72  # the supervisor is gone; an orphan must not keep claiming
RECYCLE = 73  # reached max_tasks (with jitter): a planned, graceful replacement
LEASE_STUCK = 74  # a lease was lost and the handler would not stop: the process gives up
STORE_ERROR = 75  # an unexpected store error after boot: a crash, replace me
APP_IMPORT = 76  # a supervisor's worker could not import the app itself (after a reload)

DESCRIPTIONS = {
    OK: "stopped",
    BOOT_FAILURE: "boot failure",
    TASK_TIMEOUT: "task timeout",
    HEARTBEAT_DIED: "heartbeat thread died",
    PARENT_DIED: "parent died",
    RECYCLE: "recycled after max tasks",
    LEASE_STUCK: "lease lost and handler did not stop",
    STORE_ERROR: "store error after boot",
    APP_IMPORT: "cannot import the app",
}


def describe(code: int) -> str:
    return DESCRIPTIONS.get(code, f"exit code {code}")
