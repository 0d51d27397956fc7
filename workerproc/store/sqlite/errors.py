"""SQLite's errors, translated: each ``sqlite3`` error (and each value SQLite cannot take) into
the store's own error that says what happened, so callers see one clear line."""

from __future__ import annotations

import sqlite3

from ..errors import InvalidPayload, StoreCorrupt, StoreError, StoreReadOnly, StoreUnavailable


def is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


def is_readonly(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (int(code) & 0xFF) == 8  # SQLITE_READONLY and its extended codes
    return "readonly" in str(exc)


def translate(exc: sqlite3.Error, path: str) -> StoreError:
    text = str(exc)
    if isinstance(exc, (sqlite3.InterfaceError, sqlite3.ProgrammingError)) and (
        "binding parameter" in text
    ):  # a value SQLite cannot take: that caller's, not the database's, problem
        return InvalidPayload(f"a value cannot be written: {text}")
    if isinstance(exc, sqlite3.DatabaseError) and (
        "not a database" in text or "malformed" in text or "corrupt" in text
    ):
        return StoreCorrupt(f"{path}: not a leasekeeper database or corrupt ({text})")
    if is_readonly(exc):
        return StoreReadOnly(f"{path}: cannot write the database ({text})")
    if "unable to open" in text or "readonly" in text or "disk I/O" in text:
        return StoreUnavailable(f"{path}: cannot open or write the database ({text})")
    return StoreError(f"{path}: {text}")


def undecodable(exc: UnicodeDecodeError, path: str) -> StoreCorrupt:
    """SQLite's own error text was not UTF-8: a damaged schema quoted in a "malformed
    database schema" message (the sqlite3 module cannot even decode it)."""
    text = exc.object.decode("utf-8", "replace") if isinstance(exc.object, bytes) else str(exc)
    return StoreCorrupt(f"{path}: not a leasekeeper database or corrupt ({text})")


def unbindable(exc: UnicodeEncodeError | OverflowError) -> InvalidPayload:
    """A value the driver cannot bind (a lone surrogate, an integer past 64 bits): the
    caller's problem, never the database's."""
    return InvalidPayload(f"a value cannot be written: {exc}")
