from __future__ import annotations

import pytest

from workerproc.store import open_store


@pytest.fixture
def db(db: str) -> str:
    """The root conftest's database (each backend in turn), created: the operator's commands meet
    a database the pool already opened, as an operator's shell does."""
    open_store(db).close()
    return db
