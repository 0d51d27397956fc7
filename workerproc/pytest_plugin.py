"""leasekeeper's pytest plugin (loaded by pytest itself once leasekeeper is installed): the
``leasekeeper_store`` fixture, a store on a fresh SQLite database of the test's own, whose clock
``app.run_inline`` moves past delays and retry backoffs (``workerproc.testing``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .store import Store
from .testing import temporary_store


@pytest.fixture
def leasekeeper_store() -> Iterator[Store]:
    """A store on a fresh SQLite database in a temporary directory, removed after the test:
    pass it to ``app.run_inline(..., store=leasekeeper_store)`` and look at the run's tasks
    afterwards (``leasekeeper_store.get_tasks(run.id)``)."""
    with temporary_store() as store:
        yield store
