"""Shared-memory status slots: each worker publishes its phase, the supervisor (and chaos mode)
read them without a database round trip or a pipe.

The parent creates a ``StatusBoard`` (an anonymous shared mmap) *before* forking; each worker
writes only its own slot. A sequence number makes reads consistent (odd: a write in progress).
"""

from __future__ import annotations

import mmap
import struct
import time
from typing import NamedTuple

IDLE, CLAIMING, HANDLER, COMMITTING, STOPPING = range(5)
PHASE_NAMES = ("idle", "claiming", "handler", "committing", "stopping")
IN_STORE = (CLAIMING, COMMITTING)

_SLOT = struct.Struct("<QqiiqqQ")  # seq, pid, phase, pad, task_id, attempt, since (ns)


class SlotState(NamedTuple):
    pid: int
    phase: int
    task_id: int
    attempt: int
    since: float

    @property
    def phase_name(self) -> str:
        return PHASE_NAMES[self.phase] if 0 <= self.phase < len(PHASE_NAMES) else "?"


class StatusSlot:
    def __init__(self, buf: mmap.mmap, index: int) -> None:
        self._buf = buf
        self._offset = index * _SLOT.size
        self._seq = 0

    def publish(self, pid: int, phase: int, task_id: int = 0, attempt: int = 0) -> None:
        self._seq += 1  # odd: writing
        struct.pack_into("<Q", self._buf, self._offset, self._seq)
        _SLOT.pack_into(
            self._buf, self._offset, self._seq, pid, phase, 0, task_id, attempt, time.time_ns()
        )
        self._seq += 1
        struct.pack_into("<Q", self._buf, self._offset, self._seq)

    def read(self) -> SlotState | None:
        for _ in range(100):
            seq, pid, phase, _pad, task_id, attempt, since = _SLOT.unpack_from(
                self._buf, self._offset
            )
            (again,) = struct.unpack_from("<Q", self._buf, self._offset)
            if seq % 2 == 0 and seq == again:
                return None if pid == 0 else SlotState(pid, phase, task_id, attempt, since / 1e9)
        return None

    def clear(self) -> None:
        self.publish(0, IDLE)


class StatusBoard:
    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._buf = mmap.mmap(-1, max(1, capacity) * _SLOT.size)  # MAP_SHARED | MAP_ANONYMOUS

    def slot(self, index: int) -> StatusSlot:
        if not 0 <= index < self.capacity:
            raise IndexError(f"status slot {index} out of range 0..{self.capacity - 1}")
        return StatusSlot(self._buf, index)

    def read(self, index: int) -> SlotState | None:
        return self.slot(index).read()
