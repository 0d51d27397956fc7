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
- **Checked.** An SQLite file small enough is quick-checked (``quick_check``: every page read
  once) before the first fork (``start`` refuses a damaged one) and, once a ``--drain`` has
  finished and its workers have exited, again (``checked_drain``): a page damaged under the
  pool that nobody read again (a scribbled ``-wal``: its frames are trusted, unverified, while
  the database is open, and copied into the file at the checkpoint) is reported there, in one
  line, with exit code 17, never silently accepted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass

from workerproc.store import StoreError, redact_url

from .. import exitcodes
from ..logs import event
from .arbiter import Arbiter
from .storegate import StoreGate

RESTORE = "restore the database from a backup (`supervisor check --db …` lists the damage)"
# A quick_check reads every page once: about 0.1 s per 50 MB from the page cache on the 2-core
# development machine, a few seconds per GB from a cold disk. Up to 256 MiB (the file and its
# -wal) it costs a start or a drain's end well under a second, which buys never serving, nor
# leaving behind, a damaged queue unsaid; above, the line says the check was skipped
# (`supervisor check --db` runs it, and the full integrity_check, offline).
QUICK_CHECK_MAX_BYTES = 256 * 1024 * 1024


def bounded_quick_check(gate: StoreGate, when: str) -> list[str] | None:
    """The quick check of ``gate``'s SQLite file (its problems; empty: sound), or None when
    there is none to run: a server database, or a file above ``QUICK_CHECK_MAX_BYTES`` (said
    in one line, ``when``: "start-up", say). A database too busy to check raises
    ``StoreError``."""
    if gate.file is None:
        return None  # a server database: its own checks are the server's business
    size = 0
    for path in (gate.file, gate.file + "-wal"):
        with contextlib.suppress(OSError):  # missing: the store creates it
            size += os.path.getsize(path)
    if size > QUICK_CHECK_MAX_BYTES:
        event(
            "quick_check_skipped",
            f"database is {size / 1048576:.0f} MB (> {QUICK_CHECK_MAX_BYTES // 1048576} MB): "
            f"{when} quick check skipped; run `supervisor check --db …` offline",
            size=size,
        )
        return None
    return gate.quick_check()


def checked_drain(arb: Arbiter, code: int) -> int:
    """An exit hook: a ``--drain`` that finished, its workers gone, ends with the quick check
    of its SQLite file; damage is one error line and exit ``DRAIN_CORRUPT`` (17) unless the
    code says worse already (not 0: a chaos violation, a stop on an error)."""
    if not arb.config.drain or arb.drain_failed is None:
        return code  # no drain, or one stopped before it finished
    started = time.monotonic()
    try:
        problems = bounded_quick_check(arb.gate, "the drain's closing")
    except StoreError as exc:
        event("drain_check_skipped", f"the drain's closing quick check could not run: {exc}",
              level=logging.WARNING)  # fmt: skip
        return code
    took = time.monotonic() - started
    if problems is None:
        return code
    if not problems:
        event("drain_checked", f"quick check after the drain: the database is sound "
              f"({took:.2f} s)", seconds=round(took, 3))  # fmt: skip
        return code
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    event(
        "database_corrupt",
        f"the drain finished but the database is corrupt (quick_check: {problems[0]}{more}): "
        f"{RESTORE}",
        level=logging.ERROR,
        where="drain",
        error=problems[0],
        seconds=round(took, 3),
    )
    return exitcodes.DRAIN_CORRUPT if code == exitcodes.OK else code


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
