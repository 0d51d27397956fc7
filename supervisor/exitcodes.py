"""Exit codes of the ``supervisor`` command; the README's table is generated from DESCRIPTIONS
(``supervisor/commands/reference.py``)."""

from __future__ import annotations

OK = 0  # stopped on request (graceful, fast or drained) or the command succeeded
ERROR = 1  # the command failed: database missing or corrupt, unknown run, refused operation
USAGE = 2  # a bad option or value (click's own code for usage errors)
APP_LOAD = 3  # --app cannot be imported or is not an App
WORKER_BOOT = 4  # a worker exited with workerproc's BOOT_FAILURE: respawning cannot help
PIDFILE_LOCKED = 5  # another supervisor holds the pidfile
NOT_RUNNING = 6  # stop/reload/scale/health: no live supervisor behind the pidfile
UNHEALTHY = 7  # health: the supervisor is alive but its loop stopped ticking
CHAOS_VIOLATION = 8  # start --chaos: the verifier saw a safety violation (see the report)
STATE_UNWRITABLE = 9  # health: the loop runs but cannot write its state file (disk full?)
STALLED = 10  # health: work is ready, workers are free, and nothing was claimed for too long
RELOAD_FAILED = 11  # reload --wait: the reload failed; the old workers keep serving
RUN_FAILED = 12  # wait: the run failed
RUN_CANCELLED = 13  # wait: the run was cancelled
WAIT_TIMEOUT = 14  # wait: the run had not ended within --timeout
RUN_UNKNOWN = 15  # wait: no run has that id
RUNS_FAILED = 16  # start --drain --fail-on-failed: a run failed during the drain
DRAIN_CORRUPT = 17  # start --drain: the quick check at the drain's end found the database damaged

DESCRIPTIONS = {
    OK: "success; `start`: stopped on request (graceful, fast, or `--drain` finished)",
    ERROR: "the command failed: database missing or corrupt, unknown run, refused operation; "
    "`start`: the database is corrupt or its file was deleted or replaced under the pool; "
    "`events --follow`: its database file was deleted or replaced",
    USAGE: "bad option or value (`-n 0`, `--lease-ttl inf`, invalid JSON, a non-numeric run id)",
    APP_LOAD: "`start`: the `--app` cannot be imported (or its import started threads: the parent "
    "must fork from one thread)",
    WORKER_BOOT: "`start`: a worker could not boot (worker exit code 3); the supervisor stopped",
    PIDFILE_LOCKED: "`start`: another supervisor holds the pidfile",
    NOT_RUNNING: "`stop`/`reload`/`scale`/`health`: no live supervisor behind the pidfile "
    "(missing or stale)",
    UNHEALTHY: "`health`: the supervisor is alive but its main loop has not ticked within "
    "`--max-age`",
    CHAOS_VIOLATION: "`start --chaos`: the verifier saw a safety violation (listed in the report "
    "and on stderr; a slow takeover is only a warning)",
    STATE_UNWRITABLE: "`health`: the main loop runs but cannot write its state file (disk full "
    "or read-only)",
    STALLED: "`health`: work is ready and workers are free, but nothing was claimed for "
    "`--max-stall`",
    RELOAD_FAILED: "`reload --wait`: the reload failed (the new code does not import or its "
    "workers cannot boot); the old workers keep serving",
    RUN_FAILED: "`wait`: the run failed (its reason and last error are printed)",
    RUN_CANCELLED: "`wait`: the run was cancelled",
    WAIT_TIMEOUT: "`wait`: the run had not ended within `--timeout`",
    RUN_UNKNOWN: "`wait`: no run has that id (it was never started, or was pruned)",
    RUNS_FAILED: "`start --drain --fail-on-failed`: the drain finished, and a run failed while "
    "it ran (its last line counts them; `supervisor runs --status failed` lists them); a drain "
    "stopped before it finished (TERM) is not judged, and a chaos violation (8) wins",
    DRAIN_CORRUPT: "`start --drain` on SQLite: the drain finished, but the quick integrity check "
    "that ends it (its workers gone) found the database damaged (a page written under the pool "
    "and never read again, a scribbled `-wal`); the line names the damage: restore from a "
    "backup (`supervisor check`). Wins over 16; a chaos violation (8) wins over it",
}
