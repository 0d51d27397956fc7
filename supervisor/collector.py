"""The garbage collector around the pool's start-up: what start-up makes (the app's and the
store's imports, the loop's parts) lives as long as the process, so the collections it would
set off walk a growing heap and free nothing."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def lasting() -> Iterator[None]:
    """No collection inside; on the way out (failing or not) every object made so far is frozen
    (``gc.freeze``): neither the supervisor's later collections nor its workers' (they inherit
    the frozen heap at fork) walk those objects again, and a worker's collections do not write
    to the pages it shares with the supervisor. The collector's state is restored after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()  # (before the collector is on again: no collection walks them first)
        if was:
            gc.enable()
