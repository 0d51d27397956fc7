"""Errors the store raises. The CLI turns each into one clear line on stderr."""

from __future__ import annotations


class StoreError(Exception):
    """Base class for every error the store raises on purpose."""


class StoreUnavailable(StoreError):
    """The database cannot be reached now: missing directory, no permission, or locked past the
    busy timeout (a backup holding an exclusive lock, say). Retrying later may succeed."""


class StoreReadOnly(StoreUnavailable):
    """The database can be read but not written here (a read-only or immutable file or file
    system). A process that met it may keep a read-only view until every one of its
    connections to the file is closed: a worker exits for replacement when it lasts."""


class StoreCorrupt(StoreError):
    """The file is not a leasekeeper database, or SQLite reports it malformed."""


class SchemaTooNew(StoreError):
    """The database was written by a newer leasekeeper; refuse rather than guess."""


class InvalidOption(StoreError, ValueError):
    """A store URL or option that names nothing valid: an unknown scheme or option, a SQLite URL
    with a host, a value out of its range. Nothing was opened or created: a usage error."""


class InvalidPayload(StoreError, ValueError):
    """A payload, state or result that is not JSON-serializable. Nothing was written."""


class InvalidCommit(InvalidPayload):
    """A value of a handler's own last word that cannot be stored: the run's new state, the next
    task's name, payload, delay or queue, the children it spawns, the result, or the handler's
    return value. The step writes the same value on every try, so no retry can fix it: the run
    fails at once (R6). ``InvalidPayload`` raised anywhere else in a handler (a paid answer too
    long to keep, say) is a handler error like any other, and is retried."""


class RunNotFound(StoreError, KeyError):
    """No run has that id."""

    def __str__(self) -> str:
        return f"no run with id {self.args[0]}" if self.args else "run not found"


class ForkRefused(StoreError):
    """A fork (``Store.fork``) that cannot be made: the run never entered that step, entered
    it before steps kept their input state (and no state was given), or is one of
    leasekeeper's own runs. Nothing was written."""


class RunOver(StoreError):
    """The run has finished (succeeded, failed or cancelled): a signal to it has no wait to
    resume, so it is refused rather than kept for ever."""

    def __init__(self, run_id: int, status: str) -> None:
        super().__init__(run_id, status)
        self.run_id, self.status = run_id, status

    def __str__(self) -> str:
        return f"run {self.run_id} is {self.status}: it waits for no signal"
