"""The PostgreSQL backend (the ``postgres`` extra installs its driver)."""

from .store import PostgresStore

__all__ = ["PostgresStore"]
