from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from helpers import FakeClock

from workerproc.store import Store, open_store


@pytest.fixture
def db_path(tmp_path: os.PathLike[str]) -> str:
    return os.path.join(os.fspath(tmp_path), "lk.db")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(db_path: str, clock: FakeClock) -> Iterator[Store]:
    s = open_store(db_path, clock=clock)
    yield s
    s.close()
