"""One way to log a lifecycle event, for the worker and the supervisor alike: ``name`` is stable
for scripts (the ``event`` key of ``--log-format json``), ``message`` is for people, and the
fields travel with the record so the JSON line carries them (``task_id``, ``attempt``, …)."""

from __future__ import annotations

import logging
from typing import Any


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
