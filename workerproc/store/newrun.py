"""A run to start, checked and encoded before any transaction begins: the producer-side values
every backend inserts the same way (``start_run``, ``start_runs``, transactional enqueue)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from .codec import (
    MAX_DELAY,
    MAX_PAYLOAD,
    RESERVED,
    check_name,
    check_run_options,
    check_task_version,
    check_traceparent,
    dumps,
    shown,
)
from .errors import InvalidPayload
from .limits import UNGATED, Gating
from .records import record
from .traceparent import current_traceparent
from .types import DEFAULT_QUEUE, JSON

START_FIELDS = frozenset(
    {
        "task",
        "payload",
        "state",
        "delay",
        "key",
        "queue",
        "priority",
        "traceparent",
        "debounce",
        "version",
    }
)


@record
class NewRun:
    """One run to start, checked and encoded before any transaction begins."""

    task: str
    payload: str
    state: str
    delay: float
    key: str | None
    queue: str
    priority: int
    gating: Gating = UNGATED  # what its task's limits make of it (``protocol.limits``)
    traceparent: str | None = None  # W3C trace context of its starter (``store.traceparent``)
    system: bool = False  # numbered from ``SYSTEM_RUNS`` up: a webhook's delivery run
    # debounced: a start within this many seconds of the key's pending run replaces its payload
    # and pushes its start back (``protocol.producers``); the run starts that long after it
    debounce: float | None = None
    version: int | None = None  # its first task's version (B25; None: unversioned)

    def gated(self, gating: Gating) -> NewRun:
        return dataclasses.replace(self, gating=gating)

    @classmethod
    def make(
        cls, task: str, payload: JSON, state: JSON, delay: float, key: str | None, queue: str,
        priority: int, traceparent: str | None = None, *, system: bool = False,
        debounce: float | None = None, version: int | None = None,
    ) -> NewRun:  # fmt: skip
        """``traceparent``: the W3C trace context the run's steps continue; None: the caller's
        current span's, when OpenTelemetry is installed and a span is recording; "": none.
        ``system``: one of leasekeeper's own runs (a webhook's delivery run), numbered apart,
        whose task and queue are named with ``RESERVED``; no other run may use those names."""
        check_name(task)
        if not system and task.startswith(RESERVED):
            raise InvalidPayload(
                f"task names starting with {RESERVED!r} are leasekeeper's own (got {shown(task)})"
            )
        check_run_options(queue, priority, key, system=system)
        try:
            seconds = float(delay)
        except (TypeError, ValueError):
            raise InvalidPayload(f"delay must be a number of seconds (got {delay!r})") from None
        if not 0 <= seconds <= MAX_DELAY:  # also refuses nan and inf
            raise InvalidPayload(f"delay must be from 0 to {MAX_DELAY:g} seconds (got {delay!r})")
        if debounce is not None:
            debounce = _debounce(debounce, key)
            seconds = max(seconds, debounce)
        return cls(
            task,
            dumps(payload, "payload", MAX_PAYLOAD),
            dumps({} if state is None else state, "state"),
            seconds,
            key,
            queue,
            priority,
            traceparent=(
                current_traceparent() if traceparent is None else check_traceparent(traceparent)
            ),
            system=system,
            debounce=debounce,
            version=check_task_version(version),
        )

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> NewRun:
        unknown = set(item) - START_FIELDS
        if unknown or "task" not in item:
            what = f"unknown fields {sorted(unknown)}" if unknown else "no 'task'"
            raise InvalidPayload(f"a start_runs item has {what}")
        get = item.get
        return cls.make(item["task"], get("payload"), get("state"), get("delay", 0), get("key"),
                        get("queue", DEFAULT_QUEUE), get("priority", 0),
                        get("traceparent"), debounce=get("debounce"),
                        version=get("version"))  # fmt: skip


def _debounce(debounce: object, key: str | None) -> float:
    """A debounce's seconds: above 0, at most ``MAX_DELAY``, and only with a key (what names
    the burst that collapses into one run)."""
    try:
        seconds = math.nan if isinstance(debounce, bool) else float(debounce)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = math.nan
    if not 0 < seconds <= MAX_DELAY:
        raise InvalidPayload(
            f"debounce must be above 0 and at most {MAX_DELAY:g} seconds (got {debounce!r})"
        )
    if key is None:
        raise InvalidPayload("debounce needs a key: the starts with one key make one run")
    return seconds
