"""A wall clock the test moves, for whole worker processes (put this directory on PYTHONPATH
and name the clock file in LEASEKEEPER_TEST_CLOCK_FILE): ``time.time`` answers the true time
plus the file's offset ("+1h", "-1h", "+0", or seconds), read again at every call, and
``time.monotonic`` is left alone, as an NTP step leaves CLOCK_MONOTONIC.

libfaketime does the same for a store client (tests/support/faketime.py), but not for a worker:
under libfaketime 0.9.10 Python's timed waits break (``time.sleep`` fails with EINVAL when the
monotonic clock is left alone, a lock's timed acquire never returns when it is not)."""

from __future__ import annotations

import os
import time

_FILE = os.environ.get("LEASEKEEPER_TEST_CLOCK_FILE")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0}


def _offset(path: str) -> float:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
    except OSError:
        return 0.0
    unit = _UNITS.get(text[-1:])
    try:
        return float(text[:-1]) * unit if unit is not None else float(text or 0)
    except ValueError:
        return 0.0


if _FILE:
    _real = time.time

    def _stepped(path: str = _FILE) -> float:
        return _real() + _offset(path)

    time.time = _stepped
