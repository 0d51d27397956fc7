"""A PostgreSQL store whose dialect counts its own transactions (change_token must make none)."""

from __future__ import annotations

from typing import Any

from workerproc.store import Store, open_store
from workerproc.store.postgres.dialect import PostgresDialect


class CountingDialect(PostgresDialect):
    """Counts the store's own transactions: change_token must not make any."""

    transactions = 0

    def _transaction(self, *args: Any, **kwargs: Any) -> Any:
        CountingDialect.transactions += 1
        return super()._transaction(*args, **kwargs)


def counting_store(url: str) -> Store:
    """A store on ``url`` whose dialect counts its transactions."""
    store = open_store(url)
    store.dialect.__class__ = CountingDialect  # the same dialect, counting
    return store
