"""The pool's start-up runs with the collector off and freezes what it made (``lasting``):
the supervisor's later collections and its workers' never walk those objects again. The
collector's own state is restored, on a failure too."""

from __future__ import annotations

import gc

import pytest

from supervisor.collector import lasting


def test_start_up_runs_without_collections_and_freezes_what_it_made() -> None:
    assert gc.isenabled()
    try:
        with lasting():
            assert not gc.isenabled()
            made = [[] for _ in range(10)]  # (tracked objects)
        assert gc.isenabled()
        assert gc.get_freeze_count() >= len(made)
    finally:
        gc.unfreeze()  # (this test process goes on as before)


def test_a_failing_start_up_restores_the_collector() -> None:
    try:
        with pytest.raises(RuntimeError), lasting():
            raise RuntimeError("the app did not import")
        assert gc.isenabled()
        gc.disable()
        with lasting():
            pass
        assert not gc.isenabled(), "a collector that was off stays off"
    finally:
        gc.enable()
        gc.unfreeze()
