"""The SQLite backend: one database file in WAL mode."""

from .store import SQLiteStore

__all__ = ["SQLiteStore"]
