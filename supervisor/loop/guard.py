"""The database guard: a loop step that stops the pool when its database is no longer the one it
opened, or turned out corrupt.

- **Deleted or replaced.** Workers keep working on a deleted file's inode, silently; a new file
  at the same path (``enqueue`` creates one) would never be served. At start the gate pins the
  file's device and inode; every turn one ``stat`` compares. On a mismatch the supervisor logs
  ``database_gone`` and stops (exit 1); its own sessions refuse to open the path from then on.
  (While workers hold the deleted file open its inode cannot be reused, so a new file at the
  path always has another identity.)
- **Corrupt.** Any session of the supervisor that met "database disk image is malformed" (the
  store's ``StoreCorrupt``) stops it the same way with ``database_corrupt``; a worker that meets
  it exits with ``STORE_CORRUPT`` and the reap step does the same.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from workerproc.store import redact_url

from .. import exitcodes
from ..logs import event
from .arbiter import Arbiter

RESTORE = "restore the database from a backup (`supervisor check --db …` lists the damage)"


def stop_corrupt(arb: Arbiter, where: str, detail: str) -> None:
    """Corruption seen by ``where``: say what to do, stop with the README's exit code."""
    event(
        "database_corrupt",
        f"the database is corrupt ({where}: {detail}): stopping; {RESTORE}",
        level=logging.ERROR,
        where=where,
        error=detail,
    )
    arb.stop("the database is corrupt", exitcodes.ERROR)


@dataclass
class DbGuard:
    gone: bool = False
    corrupt: bool = False

    def step(self, arb: Arbiter) -> None:
        gate = arb.gate
        problem = gate.file_problem()
        if problem and not self.gone:
            self.gone = True
            event(
                "database_gone",
                f"{problem}: stopping (a new file at that path is never taken for this pool's "
                "queue); restore the database and start again",
                level=logging.ERROR,
                db=redact_url(gate.db),
            )
            arb.stop("the database file is gone", exitcodes.ERROR)
        if gate.corrupt and not self.corrupt:
            self.corrupt = True
            stop_corrupt(arb, "supervisor", gate.corrupt)
