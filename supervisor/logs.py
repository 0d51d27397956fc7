"""Lifecycle logging: one line per event on stderr, as text or JSON.

Under journald (``JOURNAL_STREAM`` set) lines carry no timestamp: the journal adds its own.
With ``--drain`` on a terminal, a live progress line sits under the log lines; it is never drawn
when stderr is not a TTY (logs piped to a file stay clean).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, TextIO

from workerproc.logs import attach, formatter, handler, level_of
from workerproc.logs import event as log_event

LOGGER_NAME = "supervisor"
log = logging.getLogger(LOGGER_NAME)


def event(name: str, message: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """Log one lifecycle event of the supervisor (``workerproc.logs.event``, the one way both
    sides log: ``name`` is stable for scripts, ``message`` is for people)."""
    log_event(log, name, message, level=level, **fields)


class Progress:
    """A single status line redrawn in place on a terminal; a no-op elsewhere."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.enabled = stream.isatty()
        self.text = ""

    def show(self, text: str) -> None:
        if not self.enabled:
            return
        self.text = text
        self._draw()

    def _draw(self) -> None:
        self.stream.write("\r\x1b[K" + self.text)
        self.stream.flush()

    def clear(self) -> None:
        if self.enabled and self.text:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    def redraw(self) -> None:
        if self.enabled and self.text:
            self._draw()

    def finish(self) -> None:
        self.clear()
        self.text = ""


class ProgressAwareHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Clears the progress line before a log line and redraws it after."""

    def __init__(self, stream: TextIO, progress: Progress) -> None:
        super().__init__(stream)
        self.progress = progress

    def emit(self, record: logging.LogRecord) -> None:
        self.progress.clear()
        super().emit(record)
        self.progress.redraw()


def setup(fmt: str = "text", stream: TextIO | None = None, level: str = "info") -> Progress:
    """Configure logging for the supervisor and the workers it forks (they inherit it): our
    lifecycle events and every other record (the app's handlers', its libraries') at ``level``,
    one line each, tagged ``supervisor[pid]`` or ``worker[pid]``. Return the progress line bound
    to the same stream."""
    stream = stream or sys.stderr
    timestamps = not os.environ.get("JOURNAL_STREAM")
    threshold = level_of(level)
    progress = Progress(stream)
    ours = ProgressAwareHandler(stream, progress)
    ours.setFormatter(formatter(fmt, timestamps, "supervisor", os.getpid()))
    attach(log, ours, threshold)
    # Forked workers inherit these: their lines look like ours, tagged worker[pid], and a
    # handler's own records carry its task (TaskFields).
    attach(logging.getLogger("workerproc"), handler(stream, formatter(fmt, timestamps)), threshold)
    attach(logging.getLogger(), handler(stream, formatter(fmt, timestamps, "supervisor",
                                                          os.getpid())), threshold)  # fmt: skip
    # psycopg warns of every error it ignores while a failed connection is torn down (an
    # aborted pipeline, a terminated backend); the store discards such a connection and the
    # worker tells the incident once (workerproc/outage.py), so those lines are only noise.
    logging.getLogger("psycopg").setLevel(logging.ERROR)
    return progress


def drain_progress(done: int, total: int, failed: int, started: float) -> str:
    elapsed = max(time.monotonic() - started, 1e-9)
    rate = done / elapsed
    return f"drain: {done}/{total} runs done, {rate:.1f}/s, {failed} failed, {elapsed:.0f}s elapsed"
