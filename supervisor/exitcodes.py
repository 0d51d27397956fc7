"""Exit codes of the ``supervisor`` command. The README's table is generated from DESCRIPTIONS."""

from __future__ import annotations

OK = 0  # stopped on request (graceful, fast or drained) or the command succeeded
ERROR = 1  # the command failed: database missing or corrupt, unknown run, refused operation
USAGE = 2  # a bad option or value (click's own code for usage errors)
APP_LOAD = 3  # --app cannot be imported or is not an App
WORKER_BOOT = 4  # a worker exited with workerproc's BOOT_FAILURE: respawning cannot help
PIDFILE_LOCKED = 5  # another supervisor holds the pidfile
NOT_RUNNING = 6  # stop/reload/scale/health: no live supervisor behind the pidfile
UNHEALTHY = 7  # health: the supervisor is alive but its loop stopped ticking
CHAOS_VIOLATION = 8  # start --chaos: the verifier saw a violation (see the report)
RELOAD_FAILED = 9  # reload --wait: the reload failed; the old workers keep serving

DESCRIPTIONS = {
    OK: "success; `start`: stopped on request (graceful, fast or after --drain)",
    ERROR: "the command failed (database missing or corrupt, unknown run, refused operation)",
    USAGE: "bad option or value (e.g. `-n 0`, invalid JSON)",
    APP_LOAD: "`start`: the --app cannot be imported",
    WORKER_BOOT: "`start`: a worker could not boot (exit code 3); the supervisor stopped",
    PIDFILE_LOCKED: "`start`: another supervisor holds the pidfile",
    NOT_RUNNING: "stop/reload/scale/health: no live supervisor behind the pidfile",
    UNHEALTHY: "health: the supervisor is alive but its main loop is not ticking",
    CHAOS_VIOLATION: "`start --chaos`: the verifier saw a violation (the report lists it)",
    RELOAD_FAILED: "`reload --wait`: the reload failed (the new code does not import or its "
    "workers cannot boot); the old workers keep serving",
}
