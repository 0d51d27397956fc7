"""Shared-memory status slots: each worker publishes its phase, the supervisor (and chaos mode)
read them without a database round trip or a pipe.

The parent creates a ``StatusBoard`` (an anonymous shared mmap) *before* forking; each worker
writes only its own slot. A sequence number makes reads consistent (odd: a write in progress).
"""

from __future__ import annotations

import bisect
import mmap
import struct
import time
from dataclasses import dataclass, field
from typing import NamedTuple

IDLE, CLAIMING, HANDLER, COMMITTING, STOPPING = range(5)
PHASE_NAMES = ("idle", "claiming", "handler", "committing", "stopping")

_SLOT = struct.Struct("<QqiiqqQ")  # seq, pid, phase, busy slots, task_id, attempt, since (ns)

# What each worker counts, for the supervisor's metrics: no database write per task.
DURATION_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_COUNTERS = struct.Struct("<Qq3Qd" + "Q" * (len(DURATION_BOUNDS) + 1) + "2Q")
# seq, pid, claims, takeovers, tasks done, seconds in handlers, then one count per bucket (+Inf),
# then the batch calls and their items
_STRIDE = _SLOT.size + _COUNTERS.size


@dataclass
class Counters:
    """A worker's running totals; ``buckets`` are per-bucket (not cumulative) handler times."""

    claims: int = 0
    takeovers: int = 0
    done: int = 0
    seconds: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BOUNDS) + 1))
    batches: int = 0  # batch steps' calls (``@app.task(batch=...)``)
    batch_items: int = 0  # ... and the items they took

    def batch_done(self, items: int) -> None:
        self.batches += 1
        self.batch_items += items

    def task_done(self, seconds: float) -> None:
        self.done += 1
        self.seconds += seconds
        self.buckets[bisect.bisect_left(DURATION_BOUNDS, seconds)] += 1

    def add(self, other: Counters) -> None:
        self.claims += other.claims
        self.takeovers += other.takeovers
        self.done += other.done
        self.seconds += other.seconds
        self.batches += other.batches
        self.batch_items += other.batch_items
        self.buckets = [a + b for a, b in zip(self.buckets, other.buckets, strict=True)]


class SlotState(NamedTuple):
    pid: int
    phase: int
    task_id: int  # one task the worker runs (0: none)
    attempt: int
    since: float
    busy: int = 0  # handlers running now (its busy slots)

    @property
    def phase_name(self) -> str:
        return PHASE_NAMES[self.phase] if 0 <= self.phase < len(PHASE_NAMES) else "?"


class StatusSlot:
    def __init__(self, buf: mmap.mmap, index: int) -> None:
        self.index = index  # the worker's place in its pool (``status``'s INDEX)
        self._buf = buf
        self._offset = index * _STRIDE
        self._counters_at = self._offset + _SLOT.size
        self._seq = 0
        self._counters_seq = 0

    def publish(
        self, pid: int, phase: int, task_id: int = 0, attempt: int = 0, busy: int = 0
    ) -> None:
        self._seq += 1  # odd: writing
        struct.pack_into("<Q", self._buf, self._offset, self._seq)
        _SLOT.pack_into(
            self._buf, self._offset, self._seq, pid, phase, busy, task_id, attempt, time.time_ns()
        )
        self._seq += 1
        struct.pack_into("<Q", self._buf, self._offset, self._seq)

    def read(self) -> SlotState | None:
        for _ in range(100):
            seq, pid, phase, busy, task_id, attempt, since = _SLOT.unpack_from(
                self._buf, self._offset
            )
            (again,) = struct.unpack_from("<Q", self._buf, self._offset)
            if seq % 2 == 0 and seq == again:
                return (
                    None if pid == 0 else SlotState(pid, phase, task_id, attempt, since / 1e9, busy)
                )
        return None

    def clear(self) -> None:
        self.publish(0, IDLE)
        self.publish_counters(0, Counters())

    def publish_counters(self, pid: int, c: Counters) -> None:
        self._counters_seq += 1  # odd: writing
        at = self._counters_at
        struct.pack_into("<Q", self._buf, at, self._counters_seq)
        _COUNTERS.pack_into(self._buf, at, self._counters_seq, pid, c.claims, c.takeovers,
                            c.done, c.seconds, *c.buckets, c.batches, c.batch_items)  # fmt: skip
        self._counters_seq += 1
        struct.pack_into("<Q", self._buf, at, self._counters_seq)

    def read_counters(self, pid: int) -> Counters | None:
        """``pid``'s counters, or None if the slot belongs to someone else (or is mid-write)."""
        for _ in range(100):
            seq, owner, claims, takeovers, done, seconds, *buckets, batches, items = (
                _COUNTERS.unpack_from(self._buf, self._counters_at)
            )
            (again,) = struct.unpack_from("<Q", self._buf, self._counters_at)
            if seq % 2 == 0 and seq == again:
                if owner != pid:
                    return None
                return Counters(claims, takeovers, done, seconds, list(buckets), batches, items)
        return None


class StatusBoard:
    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._buf = mmap.mmap(-1, max(1, capacity) * _STRIDE)  # MAP_SHARED | MAP_ANONYMOUS

    def slot(self, index: int) -> StatusSlot:
        if not 0 <= index < self.capacity:
            raise IndexError(f"status slot {index} out of range 0..{self.capacity - 1}")
        return StatusSlot(self._buf, index)

    def read(self, index: int) -> SlotState | None:
        return self.slot(index).read()
