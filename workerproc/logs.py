"""Logging, for the worker and the supervisor alike.

- ``event``: one way to log a lifecycle event: ``name`` is stable for scripts (the ``event`` key
  of ``--log-format json``), ``message`` is for people, and the fields travel with the record so
  the JSON line carries them (``task_id``, ``attempt``, …).
- A handler's own records (``logging.getLogger(__name__).info(...)`` in a task) carry the task
  they were logged in: ``running`` marks a handler's execution (a context variable: each slot
  thread and each async task has its own), and ``TaskFields``, a filter on every handler we
  install, puts its run id, task id, task, attempt and worker index on each record logged meanwhile.
- ``TextFormatter`` and ``JsonFormatter`` write one line per record, the task's fields with it;
  ``configure`` installs them on the root logger, at the level the user chose (``--log-level``).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from .store import Lease, redact

LEVELS = ("debug", "info", "warning", "error", "critical")
# The task a handler's records belong to, while it runs: (run_id, task_id, task, attempt).
_running: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "leasekeeper_task", default=None
)
_worker: dict[str, int | None] = {"index": None}  # this process's place in its pool


def event(
    logger: logging.Logger,
    name: str,
    message: str,
    *,
    level: int = logging.INFO,
    exc_info: BaseException | None = None,
    **fields: Any,
) -> None:
    logger.log(level, message, exc_info=exc_info, extra={"event": name, "fields": fields})


def attempt_of(lease: Lease, limit: int | None = None) -> str:
    """How a log line names an attempt, the same everywhere: its fencing token and, beside it,
    the try within the task's budget (R6), ``attempt 5 (try 2 of 3)`` (``of`` when the bound is
    known where the line is written)."""
    budget = f" of {limit}" if limit else ""
    return f"attempt {lease.attempt} (try {lease.tries}{budget})"


def set_worker(index: int | None) -> None:
    """This process is the worker at ``index`` of its pool (None: not in a pool)."""
    _worker["index"] = index


@contextlib.contextmanager
def running(lease: Lease) -> Iterator[None]:
    """The records logged inside (on this thread, or in this async task and the tasks it
    starts) belong to ``lease``'s task."""
    fields: dict[str, Any] = {"run_id": lease.run_id, "task_id": lease.task_id,
                              "task": lease.task, "attempt": lease.attempt}  # fmt: skip
    if _worker["index"] is not None:
        fields["worker"] = _worker["index"]
    token = _running.set(fields)
    try:
        yield
    finally:
        _running.reset(token)


class TaskFields(logging.Filter):
    """Puts the running task's fields on a record logged while a handler runs (read on the
    thread that logs it: logging calls its handlers there). Our own lifecycle events carry
    their fields already and are left alone."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _running.get()
        if fields is not None and not hasattr(record, "event"):
            record.task_fields = fields
        return True


def level_of(name: str) -> int:
    """``info`` -> ``logging.INFO`` (ValueError for a name that is no level)."""
    if name.lower() not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)} (got {name!r})")
    return int(getattr(logging, name.upper()))


class TextFormatter(logging.Formatter):
    """``[time ]who[pid] LEVEL message``; a handler's record ends with its task's fields
    (``[run=3 task=call attempt=1 worker=0]``). ``who``: ``supervisor`` for records of the
    process ``parent`` (the supervisor), ``worker`` for any other (its forked workers)."""

    def __init__(self, timestamps: bool, who: str = "worker", parent: int | None = None) -> None:
        fmt = "%(asctime)s " if timestamps else ""
        super().__init__(fmt + "%(who)s[%(process)d] %(levelname)s %(message)s")
        self.who, self.parent = who, parent

    def format(self, record: logging.LogRecord) -> str:
        record.who = self.who if record.process == self.parent or self.parent is None else "worker"
        line = super().format(record)
        fields = getattr(record, "task_fields", None)
        if fields:
            tags = " ".join(f"{k}={v}" for k, v in fields.items())
            head, sep, rest = line.partition("\n")  # a traceback follows the message's line
            line = f"{head} [{tags}]{sep}{rest}"
        return redact(line)  # a store error may quote the database URL


class JsonFormatter(logging.Formatter):
    """One JSON object per record: level, pid, logger, event (``log`` for a handler's own),
    the message, the event's fields or the running task's, and a traceback as ``exc``."""

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
        doc.update(getattr(record, "task_fields", None) or {})
        doc.update(getattr(record, "fields", {}))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        # each text masked on its own: a URL in one never runs on into the next field
        plain = json.loads(json.dumps(doc, default=str))
        return json.dumps(_redacted(plain), separators=(",", ":"))


def _redacted(value: Any) -> Any:
    """``value`` (decoded JSON) with ``redact`` applied to every text in it, keys too."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(k): _redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return value


def formatter(
    fmt: str, timestamps: bool, who: str = "worker", parent: int | None = None
) -> logging.Formatter:
    return JsonFormatter(timestamps) if fmt == "json" else TextFormatter(timestamps, who, parent)


def handler(stream: TextIO, fmt: logging.Formatter) -> logging.Handler:
    """A stream handler with ``fmt`` that tags a handler's records with its task."""
    out = logging.StreamHandler(stream)
    out.setFormatter(fmt)
    out.addFilter(TaskFields())
    return out


def attach(logger: logging.Logger, out: logging.Handler, level: int) -> None:
    """``out`` becomes ``logger``'s handler, at ``level``, in place of any we attached before.
    A named logger of ours gets no other (and no longer propagates: its records are written
    once); the root logger keeps the handlers others put there (a test runner's capture)."""
    for old in list(logger.handlers):
        if logger.name != "root" or getattr(old, "leasekeeper", False):
            logger.removeHandler(old)
    out.leasekeeper = True  # type: ignore[attr-defined]
    logger.addHandler(out)
    logger.setLevel(level)
    if logger.name != "root":
        logger.propagate = False


def configure(level: str = "info", fmt: str = "text", stream: TextIO | None = None) -> None:
    """A worker on its own (``python -m workerproc``): every record, ours and the handlers',
    through the root logger at ``level``, tagged ``worker[pid]``."""
    stream = stream or sys.stderr
    timestamps = not os.environ.get("JOURNAL_STREAM")
    attach(logging.getLogger(), handler(stream, formatter(fmt, timestamps)), level_of(level))
    workerproc = logging.getLogger("workerproc")
    workerproc.setLevel(logging.NOTSET)  # the root's level decides
    workerproc.propagate = True
