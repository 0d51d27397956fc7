"""libfaketime (Debian's ``faketime`` package): a process whose wall clock the test sets, and
moves while it runs. Its clock is read from a file the test writes ("+1h", "-1h", "+0"), read
again at every call (FAKETIME_NO_CACHE); CLOCK_MONOTONIC is left alone
(FAKETIME_DONT_FAKE_MONOTONIC), as an NTP step leaves it. Without the library the tests skip
loudly, or fail under LEASEKEEPER_REQUIRE_TOOLS (.ci/run installs it)."""

from __future__ import annotations

import glob
import os
from pathlib import Path

from tools import require_tool

LIBRARY = "libfaketime.so.1"


def library() -> str:
    """The library's path (skip or fail without it)."""
    found = sorted(
        glob.glob(f"/usr/lib/*/faketime/{LIBRARY}") + glob.glob(f"/usr/lib/faketime/{LIBRARY}")
    )
    return require_tool("libfaketime", found[0] if found else None, "faketime")


def environment(clock_file: Path, offset: str = "+0") -> dict[str, str]:
    """What a child needs in its environment to run on ``clock_file``'s clock, which starts at
    ``offset`` ("+1h", "-1h", "+0")."""
    clock_file.write_text(offset + "\n")
    return {
        "LD_PRELOAD": library(),
        "FAKETIME_TIMESTAMP_FILE": str(clock_file),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def step(clock_file: Path, offset: str) -> None:
    """Move the children's clock to ``offset`` from the true time, at once."""
    tmp = clock_file.with_suffix(".new")
    tmp.write_text(offset + "\n")
    os.replace(tmp, clock_file)
