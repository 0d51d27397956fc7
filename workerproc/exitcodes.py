"""Exit codes of a worker process, read by its parent (the supervisor, or a shell)."""

from __future__ import annotations

OK = 0  # stopped on request (a graceful stop)
BOOT_FAILURE = 3  # cannot even boot (store unreachable, config invalid): do not respawn, stop
TASK_TIMEOUT = 70  # a handler outlived task_timeout; its lease was released: replace me
HEARTBEAT_DIED = 71  # the heartbeat thread died; without it leases would silently lapse
PARENT_DIED = 72  # the supervisor is gone; an orphan must not keep claiming
RECYCLE = 73  # reached max_tasks (with jitter): a planned, graceful replacement
LEASE_STUCK = 74  # a lease was lost and the handler would not stop: the process gives up
STORE_ERROR = 75  # an unexpected store error after boot: a crash, replace me
STORE_CORRUPT = 76  # the database is corrupt ("malformed"): replacing me cannot help
APP_IMPORT = 77  # a supervisor's worker could not import the app itself (after a reload)
SLOT_DIED = 78  # a slot thread or the event loop ended: its tasks went back; replace me

DESCRIPTIONS = {
    OK: "stopped",
    BOOT_FAILURE: "boot failure",
    TASK_TIMEOUT: "task timeout",
    HEARTBEAT_DIED: "heartbeat thread died",
    PARENT_DIED: "parent died",
    RECYCLE: "recycled after max tasks",
    LEASE_STUCK: "lease lost and handler did not stop",
    STORE_ERROR: "store error after boot",
    STORE_CORRUPT: "the database is corrupt",
    APP_IMPORT: "cannot import the app",
    SLOT_DIED: "a slot thread or the event loop died",
}


# The README's table of worker exit codes (generated from this).
MEANINGS = {
    OK: "stopped on request",
    BOOT_FAILURE: "cannot boot (store unreachable, invalid configuration): the supervisor stops "
    "rather than respawn",
    TASK_TIMEOUT: "a handler outlived `--task-timeout`",
    HEARTBEAT_DIED: "the heartbeat thread died",
    PARENT_DIED: "the parent (supervisor) is gone",
    RECYCLE: "recycled after `--max-tasks` tasks",
    LEASE_STUCK: "a handler ignored `LeaseLost` for a whole ttl after its lease was taken over",
    STORE_ERROR: "an unexpected store error after boot, or the database stayed read-only for 5 s "
    "(a crash: the supervisor restarts it, and the new process reopens the database read-write "
    "once it can)",
    STORE_CORRUPT: 'the database is corrupt ("database disk image is malformed", at boot or '
    "later): the supervisor stops with exit code 1",
    APP_IMPORT: "a worker of a reloaded pool could not import the app (the reload fails; the old "
    "workers keep serving)",
    SLOT_DIED: "a slot thread or the event loop died: its running tasks were released with a "
    "`WorkerCrashed` error and the supervisor replaces the worker",
}


def describe(code: int) -> str:
    return DESCRIPTIONS.get(code, f"exit code {code}")
