"""Lifecycle logging: one line per event on stderr, as text or JSON.

Under journald (``JOURNAL_STREAM`` set) lines carry no timestamp: the journal adds its own.
With ``--drain`` on a terminal, a live progress line sits under the log lines; it is never drawn
when stderr is not a TTY (logs piped to a file stay clean).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, TextIO

from workerproc.logs import event as log_event
from workerproc.store import redact

LOGGER_NAME = "supervisor"
log = logging.getLogger(LOGGER_NAME)


def event(name: str, message: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """Log one lifecycle event of the supervisor (``workerproc.logs.event``, the one way both
    sides log: ``name`` is stable for scripts, ``message`` is for people)."""
    log_event(log, name, message, level=level, **fields)


class TextFormatter(logging.Formatter):
    def __init__(self, timestamps: bool, who: str = "supervisor") -> None:
        fmt = "%(asctime)s " if timestamps else ""
        super().__init__(fmt + who + "[%(process)d] %(levelname)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))  # a store error may quote the database URL


class JsonFormatter(logging.Formatter):
    def __init__(self, timestamps: bool) -> None:
        super().__init__()
        self.timestamps = timestamps

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {}
        if self.timestamps:
            doc["ts"] = round(record.created, 3)
        doc.update(
            level=record.levelname.lower(),
            pid=record.process,
            logger=record.name,
            event=getattr(record, "event", "log"),
            msg=record.getMessage(),
        )
        doc.update(getattr(record, "fields", {}))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return redact(json.dumps(doc, default=str, separators=(",", ":")))


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


def setup(fmt: str = "text", stream: TextIO | None = None) -> Progress:
    """Configure the supervisor logger; return the progress line bound to the same stream."""
    stream = stream or sys.stderr
    timestamps = not os.environ.get("JOURNAL_STREAM")
    progress = Progress(stream)
    handler = ProgressAwareHandler(stream, progress)
    formatter = JsonFormatter(timestamps) if fmt == "json" else TextFormatter(timestamps)
    handler.setFormatter(formatter)
    _attach(log, handler)
    # Forked workers inherit this: their lines look like ours, tagged worker[pid].
    worker_handler = logging.StreamHandler(stream)
    worker_handler.setFormatter(
        JsonFormatter(timestamps) if fmt == "json" else TextFormatter(timestamps, "worker")
    )
    _attach(logging.getLogger("workerproc"), worker_handler)
    # psycopg warns of every error it ignores while a failed connection is torn down (an
    # aborted pipeline, a terminated backend); the store discards such a connection and the
    # worker tells the incident once (workerproc/outage.py), so those lines are only noise.
    logging.getLogger("psycopg").setLevel(logging.ERROR)
    return progress


def _attach(logger: logging.Logger, handler: logging.Handler) -> None:
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def drain_progress(done: int, total: int, failed: int, started: float) -> str:
    elapsed = max(time.monotonic() - started, 1e-9)
    rate = done / elapsed
    return f"drain: {done}/{total} runs done, {rate:.1f}/s, {failed} failed, {elapsed:.0f}s elapsed"
