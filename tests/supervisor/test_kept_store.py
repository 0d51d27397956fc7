"""The supervisor's frequent looks (the progress watch each second, the drain's after each
commit) share one kept store instead of opening one per look; no connection crosses a fork
(``before_fork`` closes it), and it is never opened on a path that names another file now.
Counted, not timed: the stores the gate opens."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

import supervisor.loop.storegate as storegate
from supervisor.errors import SupervisorError
from supervisor.loop.storegate import StoreGate
from workerproc.store import StoreUnavailable, open_store


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every store the gate opens, by its address."""
    seen: list[str] = []

    def counting(db: str, **kw: Any) -> Any:
        seen.append(db)
        return open_store(db, **kw)

    monkeypatch.setattr(storegate, "open_store", counting)
    yield seen


def test_the_frequent_looks_share_one_store_and_a_fork_closes_it(
    db: str, opened: list[str]
) -> None:
    open_store(db).close()  # (created and migrated)
    gate = StoreGate(db)
    gate.pin()
    try:
        for _ in range(5):
            assert gate.ready_now() is False
        assert len(opened) == 1, "five looks, one store"
        with pytest.raises(SupervisorError):
            gate.assert_closed()  # the kept store is a connection: no fork with it open
        gate.before_fork()
        gate.assert_closed()
        with open_store(db) as other:
            other.start_run("t")
        assert gate.ready_now() is True
        assert len(opened) == 2, "opened again after the fork"
        with gate.session():  # a step's own session is still its own
            pass
        assert len(opened) == 3
    finally:
        gate.close_kept()


def test_the_kept_store_is_never_used_on_a_replaced_file(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(os.fspath(tmp_path), "lk.db")
    open_store(path).close()
    gate = StoreGate(path)
    gate.pin()
    try:
        assert gate.ready_now() is False
        open_store(path + ".new").close()
        os.replace(path + ".new", path)  # another database now has its name
        with pytest.raises(StoreUnavailable):
            gate.ready_now()
        gate.assert_closed()  # and the store it kept on the old file is closed
    finally:
        gate.close_kept()
